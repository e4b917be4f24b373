"""`smallem figures`: every PNG of figures/ (the ones README.md shows), redrawn from the package.

Sits on top of course/common/plots.py and training/loop.py and computes nothing of its own. The drawings are
deterministic: fixed seeds, fixed sizes and dpi, matplotlib's default style, no pyplot, and no
timestamp or version in the PNG metadata, so a rerun on the same machine gives the same bytes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..backends import get_backend
from ..data import VOCAB
from ..errors import SmallemError, require
from ..files import atomic_write, check_writable
from ..training.config import BATCH, EVAL_BATCHES

DPI = 110  # with the sizes below: about 1200 px wide, sharp in a README, small in git
STEPS = 2000  # training figures: a CPU-sized run (one to three minutes on two cores)
PNG_METADATA = {"Software": None}  # no matplotlib version in the file: upgrades change no byte


@dataclass
class Runs:
    """The training runs behind the training figures, made once per invocation and shared
    (the AdamW run of `mlp_vs_bigram` is the AdamW curve of `sgd_vs_adamw`)."""

    steps: int = STEPS
    batch: int = BATCH
    backend: str = "cpu"
    eval_batches: int = EVAL_BATCHES
    corpus_path: str | None = None
    log: Callable[[str], Any] | None = None  # a line when a run starts (a few minutes each)
    progress: bool = False  # a bar during each run
    _corpus: Any = field(default=None, repr=False)
    _done: dict[tuple, Any] = field(default_factory=dict, repr=False)
    health: dict[tuple, Any] = field(default_factory=dict, repr=False)  # key: HealthMonitor

    def corpus(self) -> Any:
        if self._corpus is None:
            from ..data import load_corpus

            self._corpus = load_corpus(self.corpus_path)
        return self._corpus

    def run(self, model: str = "mlp", optimizer: str = "adamw", lr: float | None = None) -> Any:
        """A TrainResult for this model and optimizer, seed 0, `steps` steps of `batch`."""
        key = (model, optimizer, lr)
        if key not in self._done:
            from ..training.config import TrainConfig, build_model
            from ..training.health import HealthMonitor
            from ..training.loop import train

            config = TrainConfig(model=model, optimizer=optimizer, lr=lr, backend=self.backend,
                                 steps=self.steps, batch=self.batch, seed=0,
                                 corpus=self.corpus_path,
                                 # ~100 points on the train curve, ~20 held-out evaluations
                                 log_every=max(self.steps // 100, 1),
                                 eval_every=max(self.steps // 20, 1),
                                 eval_batches=self.eval_batches, save_every=0)
            # Watching changes no number of the run: every run is watched, ~40 samples.
            monitor = HealthMonitor(max(self.steps // 40, 1), build_model(config, "cpu64"))
            if self.log is not None:
                self.log(f"training the {model} with {optimizer} for the figures: "
                         f"{self.describe()}")
            self._done[key] = train(config, corpus=self.corpus(), progress=self.progress, log=None,
                                    observer=monitor)
            self.health[key] = monitor
        return self._done[key]

    def describe(self) -> str:
        corpus = "default corpus" if self.corpus_path is None else f"corpus {self.corpus_path}"
        return f"{self.steps:,} steps of batch {self.batch}, seed 0, {self.backend}, {corpus}"


def _figure(size: tuple[float, float], panels: int = 1) -> tuple[Any, list[Any]]:
    """A pyplot-free Figure: nothing global is touched, nothing is shown."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    return fig, [fig.add_subplot(1, panels, k + 1) for k in range(panels)]


def _measured(result: Any, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one history column, without the steps where it was not measured."""
    curves = result.curves()
    keep = ~np.isnan(curves[key])
    return curves["step"][keep], curves[key][keep]


# the figures --------------------------------------------------------------------------------
def network_221(runs: Runs) -> Any:
    """The 2-2-1 network of lessons 01 and 07 with every number of its first pass on it."""
    from ..course.common.plots import draw_network
    from ..models import toy

    record = toy.forward_backward()
    fig, (ax,) = _figure((10.5, 4.7))
    draw_network(record, ax, title="The 2-2-1 ReLU network: every value of the forward pass, "
                 f"every gradient of the backward pass (loss {record.loss:g})")
    return fig


def learning_rate_cliff(runs: Runs) -> Any:
    """Loss after 20 steps for 201 learning rates: the cliff just below η = 0.5 (lesson 07)."""
    from ..course.common.plots import plot_cliff
    from ..models import toy

    scan = toy.scan_learning_rates(np.logspace(-2, 0, 201), steps=toy.CLIFF_STEPS)
    edge = toy.find_cliff(0.1, 1.0, steps=toy.CLIFF_STEPS)
    fig, (ax,) = _figure((7.5, 4.2))
    plot_cliff(scan, ax, cliff=edge)
    return fig


def mlp_vs_bigram(runs: Runs) -> Any:
    """Held-out loss of the MLP and of a bigram, trained by the same loop on the same batches,
    against the best bigram there is (fitted from counts) and the starting point ln V (V = 257 tokens)."""
    from ..course.common.plots import plot_curves

    mlp, bigram = runs.run("mlp"), runs.run("bigram")  # registry.py: each its own default lr
    best = mlp.bigram_held_out_loss
    fig, (ax,) = _figure((8.0, 4.6))
    names = (f"MLP, {mlp.model.parameter_count():,} parameters "
             f"(AdamW lr {mlp.config.learning_rate:g})",
             f"bigram, {bigram.model.parameter_count():,} parameters "
             f"(AdamW lr {bigram.config.learning_rate:g})")
    plot_curves({names[0]: _measured(mlp, "held_out_loss"),
                 names[1]: _measured(bigram, "held_out_loss")},
                ax, logy=True, markers=names,  # a dot where a held-out loss was measured
                ylabel="held-out loss (nats per byte, log scale)",
                hline={f"ln {VOCAB} = {np.log(VOCAB):.3f}: every byte equally likely":
                       float(np.log(VOCAB))},
                title=f"The MLP sees 16 bytes, the bigram one\n{runs.describe()}")
    # In the legend, not on the line: the trained bigram's curve runs right along it.
    ax.axhline(best, color="black", ls="--", lw=1,
               label=f"best bigram (fitted from counts): {best:.2f}")
    ax.set_ylim(1.6, 6.2)
    ax.yaxis.set_major_formatter("{x:.1f}")
    ax.yaxis.set_minor_formatter("{x:.1f}")
    ax.legend(fontsize=9, loc="center right")
    return fig


def sgd_vs_adamw(runs: Runs) -> Any:
    """The MLP trained by SGD and by AdamW from the same weights on the same batches: the
    training loss (mean of each log interval) and the held-out loss, side by side."""
    from ..course.common.plots import plot_curves

    sgd, adamw = runs.run("mlp", "sgd"), runs.run("mlp", "adamw")
    names = {f"SGD, lr {sgd.config.learning_rate:g}": sgd, f"AdamW, lr {adamw.config.learning_rate:g}": adamw}
    fig, (left, right) = _figure((11.0, 4.2), panels=2)
    for ax, key, label in ((left, "train_loss", "training loss (mean over each log interval)"),
                           (right, "held_out_loss", "held-out loss")):
        plot_curves({name: _measured(r, key) for name, r in names.items()}, ax, ylabel=label,
                    hline={f"best bigram {adamw.bigram_held_out_loss:.2f}":
                           adamw.bigram_held_out_loss})
        ax.set_ylim(1.8, 3.6)  # the first steps fall from 5.55 off the top: the race is below
    fig.suptitle(f"SGD and AdamW on the byte MLP: same initial weights, same batches\n"
                 f"{runs.describe()}", fontsize=11)
    return fig


def training_health(runs: Runs) -> Any:
    """The training-health dashboard of the AdamW MLP run (lesson 05): loss, the tanh layer's
    activations, saturation, gradient norms and update-to-data ratios."""
    from ..course.common.dashboard import figure

    result = runs.run("mlp")
    monitor = runs.health[("mlp", "adamw", None)]
    return figure(monitor.records, result.history,  # the history holds step 0's evaluation too
                  title=f"Training health of the byte MLP, sampled every {monitor.every} steps\n"
                        f"{runs.describe()}")


FIGURES: dict[str, Callable[[Runs], Any]] = {
    "network_221": network_221,
    "learning_rate_cliff": learning_rate_cliff,
    "mlp_vs_bigram": mlp_vs_bigram,
    "sgd_vs_adamw": sgd_vs_adamw,
    "training_health": training_health,
}
FAST = ("network_221", "learning_rate_cliff")  # no training: a second or two
TRAINING = ("mlp_vs_bigram", "sgd_vs_adamw", "training_health")  # `--steps` sets their length


def make_figures(out: str | Path = "figures", only: Sequence[str] | None = None, *,
                 runs: Runs | None = None, log: Callable[[str], Any] | None = print
                 ) -> list[Path]:
    """Draw the figures named in `only` (all when None) into `out` as NAME.png; returns the
    paths written."""
    from matplotlib import style

    names = list(FIGURES) if not only else [n.removesuffix(".png") for n in only]
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise SmallemError(f"unknown figure {unknown[0]!r}: choose among {', '.join(FIGURES)}")
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise SmallemError(f"--out {str(out)!r} is a file: give a folder for the figures")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except NotADirectoryError:
        above = next(p for p in out.parents if p.exists())
        raise SmallemError(f"cannot create folder {str(out)!r} for the figures: {str(above)!r} "
                           "is not a folder; give --out a folder you can create") from None
    except OSError as error:
        raise SmallemError(f"cannot create folder {str(out)!r} for the figures: "
                           f"{(error.strerror or str(error)).lower()}; give --out a folder you "
                           "can create") from None
    check_writable(out / f"{names[0]}.png", "figure")  # before drawing, not after
    runs = runs or Runs()
    written = []
    for name in names:
        # Matplotlib's own defaults, whatever the user's matplotlibrc says: same pixels.
        with style.context("default"):
            fig = FIGURES[name](runs)
            path = out / f"{name}.png"
            atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=DPI,
                                                      metadata=PNG_METADATA), what="figure")
        written.append(path)
        if log is not None:
            log(f"wrote {path}" + (f" ({runs.describe()})" if name in TRAINING else ""))
    return written


def main(out: str = "figures", only: Sequence[str] | None = None, steps: int = STEPS,
         batch: int = BATCH, backend: str = "cpu", corpus: str | None = None) -> int:
    """The `smallem figures` command."""
    import matplotlib

    matplotlib.use("Agg")  # a command line draws files, never windows
    require("--steps", steps, "count")
    require("--batch", batch, "count")
    get_backend(backend)  # an unknown or absent backend is one clear sentence, before any drawing
    # A bar per training run on a terminal; a line per run and per figure in a log.
    make_figures(out, only, runs=Runs(steps=steps, batch=batch, backend=backend, corpus_path=corpus,
                                      log=print, progress=sys.stderr.isatty()))
    return 0

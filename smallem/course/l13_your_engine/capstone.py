"""The capstone (notebook 13): the learner's pieces (pieces.py) assembled into one engine, a tape
with their rules planted, their accumulate and unbroadcast, their clipping and AdamW update, which
trains the byte MLP beside the package's own engine on the same batches. A piece left blank is the
package's, and said so; a wrong one makes the race diverge, and its check names it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...autodiff.tape import Tape
from ...data import BatchSampler, Corpus, fixed_batches, load_corpus
from ...errors import SmallemError
from ...models.mlp import Mlp, MlpConfig
from ...optim import ADAMW_BETAS, ADAMW_EPS, AdamW
from ...optim import clip_by_global_norm as package_clip
from ...training.config import EVAL_BATCH
from ..common.progress import answers, progress_file
from .diagnosis import Finding, diagnose
from .pieces import (
    RULE_OF,
    Piece,
    YourTape,
    as_rule,
    guard,
    your_loss,
    your_pieces,
)

AGREE = 1e-9  # two float64 engines doing the same sums in another order differ by ~1e-15
CONFIG = MlpConfig(context=8, embed=16, hidden=128)  # 53,777 parameters: 400 steps in about 2 s


# -- the two engines and their race -----------------------------------------------------------
SETTINGS = {"lr": 3e-3, "weight_decay": 0.01, "max_norm": 1.0}


class YourEngine:
    """The learner's pieces in one engine: a YourTape with their rules planted, their clipping
    and their AdamW update (the package's code wherever a piece is not theirs)."""

    def __init__(self, pieces: list[Piece], model: Any, settings: dict, *,
                 loss: Callable = your_loss, rules: dict | None = None) -> None:
        by = {p.id: p for p in pieces}
        self.model, self.settings, self.loss = model, settings, loss
        self.rules = ({RULE_OF[p.id]: as_rule(p) for p in pieces if p.id in RULE_OF and p.yours}
                      if rules is None else rules)
        mine = lambda eid: guard(by[eid]) if by[eid].yours else None  # noqa: E731
        self.accumulate, self.unbroadcast = mine("02.accumulate"), mine("03.unbroadcast")
        self.clip, self.update = mine("08.clip_by_global_norm"), mine("06.adamw_step")
        self.moments = {p: (np.zeros(p.shape), np.zeros(p.shape)) for p in model.parameters()}
        self.t = 0
        self.clipped = 0  # steps whose gradients the clipping shortened

    def step(self, contexts: np.ndarray, targets: np.ndarray) -> float:
        tape = YourTape("cpu64", rules=self.rules, accumulate=self.accumulate,
                        unbroadcast=self.unbroadcast)
        loss = self.loss(tape, self.model, contexts, targets)
        gradients = tape.backward(loss)
        params = self.model.parameters()
        grads = [np.asarray(p.grad(gradients)) for p in params]
        del tape, gradients  # the tape is gone before the update: nothing can read stale weights
        s, self.t = self.settings, self.t + 1
        self.clipped += float(np.sqrt(sum(np.sum(g * g) for g in grads))) > s["max_norm"]
        grads = (self.clip(grads, s["max_norm"]) if self.clip is not None
                 else package_clip("cpu64", grads, s["max_norm"])[0])
        for p, g in zip(params, grads):
            m, v = self.moments[p]
            wd = s["weight_decay"] if p.decay else 0.0
            if self.update is None:  # the package's update, the one AdamW.step runs
                p.backend.adamw_update([p.value], [np.asarray(g)], [m], [v], steps=[self.t], lr=s["lr"],
                                       beta1=ADAMW_BETAS[0], beta2=ADAMW_BETAS[1], eps=ADAMW_EPS,
                                       weight_decays=[wd])
                continue
            new_p, m, v = self.update(p.value.copy(), np.asarray(g), m, v, self.t, s["lr"],
                                      *ADAMW_BETAS, ADAMW_EPS, wd)
            p.value[...] = new_p
            self.moments[p] = (np.asarray(m, dtype=np.float64), np.asarray(v, dtype=np.float64))
        return float(loss.value)


class PackageEngine:
    """The package's own: model.loss on a Tape, AdamW with clipping."""

    def __init__(self, model: Mlp, settings: dict) -> None:
        self.model = model
        self.optimizer = AdamW(settings["lr"], weight_decay=settings["weight_decay"],
                               max_norm=settings["max_norm"])

    def step(self, contexts: np.ndarray, targets: np.ndarray) -> float:
        tape = Tape("cpu64")
        loss = self.model.loss(tape, contexts, targets)
        self.optimizer.step(self.model.parameters(), tape.backward(loss))
        return float(loss.value)


def _home(path: Any) -> str:
    """A path with the home folder written ~, as a learner would type it."""
    import os

    home = os.path.expanduser("~")
    text = str(path)
    return "~" + text[len(home):] if home not in ("", "/") and text.startswith(home + os.sep) else text


def evaluate(result: Race, models: list, held: list, step: int, since: float,
             log: Callable[[str], Any] | None) -> None:
    """One evaluation point of a race (the MLP's here, the Transformer's in your_transformer.py):
    both engines' held-out losses, the largest weight difference, the row kept and logged."""
    weights = max(float(np.max(np.abs(a.numpy() - b.numpy())))
                  for a, b in zip(*(m.parameters() for m in models)))
    row = {"step": step, "yours": _held_out(models[0], held), "package": _held_out(models[1], held),
           "loss": since, "weights": weights}
    result.evaluations.append(row)
    if log is not None:
        log(f"step {step:>4}: held-out loss {row['yours']:.6f} (yours) {row['package']:.6f} "
            f"(the package's); largest difference since the last: loss {since:.1e}, weights {weights:.1e}")


def _held_out(model: Any, batches: list) -> float:
    total = 0.0
    for contexts, targets in batches:
        tape = Tape("cpu64")
        total += float(model.loss(tape, contexts, targets).value)
        tape.close()
    return total / len(batches)


ZERO_AT = 1e-17  # where the difference plot draws an exact 0 (a log scale has no 0)


@dataclass
class Race:
    """Both engines' losses at every step, and at each evaluation the held-out losses and the
    largest differences since the last one."""

    pieces: list[Piece]
    findings: list[Finding]
    steps: list[int] = field(default_factory=list)
    yours: list[float] = field(default_factory=list)
    package: list[float] = field(default_factory=list)
    evaluations: list[dict] = field(default_factory=list)
    stopped: str = ""  # why the race could not run (a piece that raised), else ""
    clipped: int = 0  # steps at which clipping shortened your engine's step
    what: str = "the byte MLP"  # what the engines trained

    @property
    def count(self) -> int:
        return sum(p.yours for p in self.pieces)

    @property
    def largest_difference(self) -> float:
        d = np.abs(np.subtract(self.yours, self.package))
        return float(np.nanmax(np.where(np.isnan(d), np.inf, d))) if d.size else math.inf

    @property
    def agrees(self) -> bool:
        return not self.stopped and self.largest_difference <= AGREE

    def diverged_at(self) -> int | None:
        d = np.abs(np.subtract(self.yours, self.package))
        bad = np.flatnonzero(~(d <= AGREE))
        return int(self.steps[bad[0]]) if bad.size else None

    def pieces_line(self) -> str:
        theirs = [p for p in self.pieces if not p.yours]
        line = f"{self.count} of {len(self.pieces)} pieces are yours"
        if not theirs:
            return line + "."
        return line + "; the package's stand in for " + "; ".join(
            f"{p.id} ({p.reason})" for p in theirs) + "."

    def verdict(self) -> str:
        wrong = [f for f in self.findings if not f.ok]
        if self.stopped:
            return f"✗ The race could not run: {self.stopped}"
        if not self.agrees:
            k = self.diverged_at()
            i = self.steps.index(k)
            line = (f"✗ The race diverged: at step {k} the losses differ by "
                    f"{abs(self.yours[i] - self.package[i]):.2g} (yours {self.yours[i]:.6f}, the "
                    f"package's {self.package[i]:.6f}), and by {self.largest_difference:.2g} at worst. ")
            return line + (wrong[0].sentence[0].upper() + wrong[0].sentence[1:] if wrong else
                           "Each of your pieces agrees with the package's alone on the model's shapes; "
                           "look at how they are used together.")
        stood_in = "".join(f" The package's {p.id} stood in for yours, which {p.reason}." for p in self.pieces
                           if not p.yours and p.reason != "left blank")
        if self.count == 0 and stood_in:
            head = "✓ None of your pieces could be used, so this race is the package against itself"
        elif self.count == 0:
            head = (f"✓ None of the pieces is yours yet (no passing answer kept in "
                    f"{_home(progress_file())}), so this race is the package against itself, its loss "
                    "written two ways")
        elif self.count == len(self.pieces):
            head = f"✓ Your engine trained {self.what}: every piece is yours"
        else:
            head = f"✓ Your engine trained {self.what} with {self.count} of {len(self.pieces)} pieces yours"
        line = (f"{head}. Over {len(self.steps)} steps its loss agrees with the package's engine to "
                f"{self.largest_difference:.1e} at worst: float64 rounding, the same sums in another order.")
        if wrong:
            line += " Even so, " + wrong[0].sentence + " (the race does not use that part)"
        return line + stood_in

    def plot(self, ax: Any = None) -> Any:
        """The two loss curves on one plot, and their difference on a log scale beside them."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
        left, right = ax
        left.plot(self.steps, self.package, color="0.6", lw=4, label="the package's engine")
        left.plot(self.steps, self.yours, color="C3", lw=1.3, label=f"your engine ({self.count} of "
                                                                        f"{len(self.pieces)} pieces yours)")
        left.set(xlabel="step", ylabel="training loss (nats per byte)", title="The same batches, two engines")
        left.legend()
        diff = np.abs(np.subtract(self.yours, self.package))
        right.semilogy(self.steps, np.maximum(diff, ZERO_AT), color="C3", lw=1)
        zero = diff == 0  # exactly equal: marked on a row of their own, a decade above the axis
        right.plot(np.asarray(self.steps)[zero], np.full(int(zero.sum()), ZERO_AT), "o", ms=3,
                   color="C3", label=f"exactly 0 ({int(zero.sum())} of {zero.size} steps)")
        right.axhline(AGREE, color="0.5", ls="--", lw=1)
        right.text(self.steps[0], AGREE * 2, "float64 agreement ends here", color="0.4", fontsize=8)
        top = max(10.0, 3 * float(np.nanmax(diff, initial=0.0)))
        right.set(xlabel="step", ylabel="|your loss − the package's|", ylim=(ZERO_AT / 10, top),
                  title=f"Their difference (0 drawn at {ZERO_AT:.0e})")
        if zero.any():
            right.legend(loc="upper right", fontsize=8)
        return ax


def race(sources: dict[str, str] | None = None, *, steps: int = 400, batch: int = 64,
         eval_every: int = 50, settings: dict | None = None, seed: int = 0, corpus: Any = None,
         config: MlpConfig | None = None, progress_bar: bool = True, log: Callable | None = print,
         plant: dict[str, str] | None = None) -> Race:
    """Train two copies of one small byte MLP (same weights, same batches): one with the
    learner's engine, one with the package's; `log` gets a line at each evaluation. `sources`:
    the pieces' sources (default: the progress store's); `plant` replaces some of them."""
    for name, value in (("steps", steps), ("eval_every", eval_every), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SmallemError(f"the race's {name} must be a whole number of at least 1, got {value!r}")
    if batch < 2 or batch % 2:
        raise SmallemError(f"the race splits each batch in two equal halves: batch must be even, got {batch}")
    settings = {**SETTINGS, **(settings or {})}
    config = config or CONFIG
    if corpus is None or isinstance(corpus, (str, os.PathLike)):  # a path: read as `train --corpus` does
        corpus = load_corpus(corpus)
    elif not isinstance(corpus, Corpus):
        raise SmallemError(f"the race's corpus must be a path to a text file or folder, or a Corpus from "
                           f"load_corpus(), got {type(corpus).__name__}")
    pieces = your_pieces({**(answers() if sources is None else sources), **(plant or {})})
    models = [Mlp(config, backend="cpu64", seed=seed) for _ in range(2)]
    sampler = BatchSampler(corpus.train, batch, context=config.context, seed=seed)
    held = fixed_batches(corpus.held_out, EVAL_BATCH, 2, context=config.context)
    first = sampler.next()
    findings = diagnose(pieces, models[0], *first, settings)
    result = Race(pieces, findings)
    for f in findings:  # a name defined in another notebook cell: this kernel cannot run that piece
        if not f.runs and "raised NameError" in f.sentence:
            why = f.sentence.split("raised ", 1)[1].split(" as ", 1)[0]
            f.piece.fn, f.piece.reason = None, f"its source raised {why} here: define what it uses inside it"
        elif f.damaged:  # it returned None, a number for a tuple, or nan: it cannot be one of the parts
            f.piece.fn, f.piece.reason = None, f.sentence.rstrip(".").replace(f"your {f.piece.id} ", "", 1)
    result.findings = findings = [f for f in findings if f.piece.yours]
    broken = [f for f in findings if not f.runs]
    if broken:
        result.stopped = broken[0].sentence
        return result
    yours, package = YourEngine(pieces, models[0], settings), PackageEngine(models[1], settings)
    return run(result, yours, package, lambda step: first if step == 1 else sampler.next(), models, held,
               steps=steps, eval_every=eval_every, log=log, progress_bar=progress_bar, desc="the race",
               name_the_piece=True)


def run(result: Race, yours: YourEngine, package: PackageEngine, batch: Callable[[int], tuple],
        models: list, held: list, *, steps: int, eval_every: int, log: Callable | None,
        progress_bar: bool, desc: str, name_the_piece: bool = False) -> Race:
    """The race itself, the MLP's (race above) and the Transformer's (your_transformer.py): at
    each step both engines train on `batch(step)`, evaluated every `eval_every` steps and at the
    last; a piece that raises stops it in one sentence (naming the piece found wrong, where
    `name_the_piece`)."""
    from ...training.bar import progress_bar as tqdm

    since = 0.0
    for step in tqdm(range(1, steps + 1), disable=not progress_bar, desc=desc, unit="step"):
        inputs, targets = batch(step)
        try:
            mine = yours.step(inputs, targets)
        except SmallemError as failed:  # a piece that raised, or a gradient of the wrong shape
            wrong = [f.sentence for f in result.findings if not f.ok] if name_the_piece else []
            result.stopped = f"{str(failed).rstrip('.')}, at step {step}." + (
                f" {wrong[0][0].upper()}{wrong[0][1:]}" if wrong and wrong[0] not in str(failed) else "")
            return result
        result.steps.append(step)
        result.yours.append(mine)
        result.package.append(package.step(inputs, targets))
        since = max(since, abs(mine - result.package[-1]) if math.isfinite(mine) else math.inf)
        if step % eval_every == 0 or step == steps:
            evaluate(result, models, held, step, since, log)
            since = 0.0
    result.clipped = yours.clipped
    return result

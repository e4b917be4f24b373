"""The training-health dashboard: loss curves and training/health.py's statistics in one figure.

Sits on top of training/health.py (which measures) and matplotlib; computes nothing of its own. `draw`
fills a Figure from records (a live monitor's, or `load_health` of a `--health` log); each
`plot_*` panel draws on one Axes (`ax`, or a new figure) and returns it, records first as in
plots.py, so a lesson can compose its own comparisons. `LiveDashboard` is the observer a
notebook passes to `train`: one figure, redrawn in place, that is also the cell's progress
display.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...training.config import HEALTH_EVERY
from ...training.health import REFERENCE_RATIO, SATURATION, HealthMonitor, health_series
from .plots import axes_or_new

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Records = Sequence[Mapping[str, Any]]
SIZE = (13.0, 7.4)  # inches: six panels, legible at the width JupyterLab gives a figure
PANEL = (5.0, 3.6)  # inches: one panel drawn on its own (a plot_* called without `ax`)


def _colours(names: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cycle = colormaps["tab10"].colors
    return {name: cycle[k % len(cycle)] for k, name in enumerate(names)}


# the panels ----------------------------------------------------------------------------------
def plot_loss(records: Records, ax: Axes | None = None, *, losses: Records = (), label: str = ""
              ) -> Axes:
    """Training and held-out loss from the loop's history; the sampled steps' own losses
    when there is no history (a hand-made loop)."""
    ax = axes_or_new(ax, PANEL)
    prefix = f"{label}, " if label else ""
    train = [(r["step"], r["train_loss"]) for r in losses if r.get("train_loss") is not None]
    held = [(r["step"], r["held_out_loss"]) for r in losses if r.get("held_out_loss") is not None]
    if not train:
        train = [(r["step"], r["loss"]) for r in records]
    if train:
        ax.plot(*zip(*train), lw=1.2, label=f"{prefix}training loss")
    if held:
        ax.plot(*zip(*held), "o-", ms=3, lw=1.2, label=f"{prefix}held-out loss")
    ax.set(xlabel="step", ylabel="loss (nats)", title="Loss")
    if train or held:
        ax.legend(fontsize=8)
    return ax


def plot_histograms(records: Records, ax: Axes | None = None, *, label: str = "") -> Axes:
    """Each activation layer's histogram at the last sampled step (solid) and the first
    (dotted), as a fraction of all values; the saturation zones shaded."""
    ax = axes_or_new(ax, PANEL)
    if not records:
        return ax
    first, last = records[0], records[-1]
    layers = list(last["activations"])
    colours = _colours(layers)
    shown = ((first, ":"), (last, "-")) if len(records) > 1 else ((last, "-"),)
    for name in layers:
        for record, style in shown:
            stats = record["activations"].get(name)
            if stats is None:
                continue
            counts = np.asarray(stats["counts"], dtype=np.float64)
            ax.stairs(counts / max(counts.sum(), 1), stats["edges"], color=colours[name], ls=style,
                      label=f"{label + ' ' if label else ''}{name}, step {record['step']}")
    if any(stats["op"] == "tanh" for stats in last["activations"].values()):
        for x0, x1 in ((-1, -SATURATION), (SATURATION, 1)):
            ax.axvspan(x0, x1, color="tab:red", alpha=0.12, lw=0)
    ax.set(xlabel="activation value", ylabel="fraction of values", title="Activations")
    ax.legend(fontsize=7)
    return ax


def plot_saturation(records: Records, ax: Axes | None = None, *, label: str = "", style: str = "-"
                    ) -> Axes:
    """Per layer: the fraction of saturated values (|tanh| > 0.97; a ReLU at 0) and of dead
    units (saturated on every example of the batch), in percent."""
    ax = axes_or_new(ax, PANEL)
    prefix = f"{label}, " if label else ""
    saturated = health_series(records, "activations", "saturated")
    dead = health_series(records, "activations", "dead")
    colours = _colours(list(saturated))
    for name, (steps, values) in saturated.items():
        ax.plot(steps, 100 * values, style, color=colours[name], label=f"{prefix}{name}: saturated")
        ax.plot(dead[name][0], 100 * dead[name][1], style, color=colours[name], lw=2.5, alpha=0.45,
                label=f"{prefix}{name}: dead units")
    peak = max([100 * np.nanmax(v) for _, v in saturated.values() if len(v)] + [0.0])
    top = min(max(5.0, 1.15 * peak), 100.0)  # a healthy 0.8 % must not vanish in a 0-100 axis
    ax.set(xlabel="step", ylabel="percent", title="Saturated values and dead units",
           ylim=(-top / 30, top * 1.03))
    if saturated:
        ax.legend(fontsize=7)
    return ax


def plot_grad_norms(records: Records, ax: Axes | None = None, *, label: str = "", style: str = "-"
                    ) -> Axes:
    """‖d loss / d p‖ per parameter over training, log scale (an exact zero: a marker at the
    bottom)."""
    ax = axes_or_new(ax, PANEL)
    _per_parameter(ax, health_series(records, "parameters", "grad_norm"), label, style,
                   log=True, missing=lambda v: v == 0, missing_text="zero gradient")
    ax.set(xlabel="step", ylabel="gradient norm", title="Gradient norm per parameter")
    return ax


def plot_update_ratios(records: Records, ax: Axes | None = None, *, label: str = "", style: str = "-"
                       ) -> Axes:
    """log10(‖Δp‖/‖p‖) per parameter, with the ≈ −3 reference line (no update: a marker at
    the bottom)."""
    ax = axes_or_new(ax, PANEL)
    series = health_series(records, "parameters", "update_ratio")
    moved = health_series(records, "parameters", "update_norm")
    # NaN where nothing moved (marked), or where p was exactly 0 (a bias at its start: a gap)
    series = {name: (steps, np.where(moved[name][1] == 0, -np.inf, values))
              for name, (steps, values) in series.items()}
    _per_parameter(ax, series, label, style, log=False, missing=np.isneginf,
                   missing_text="no update at all")
    ax.axhline(REFERENCE_RATIO, color="black", ls="--", lw=1)
    ax.annotate("≈ −3: the usual pace", (0.99, REFERENCE_RATIO), xycoords=("axes fraction", "data"),
                ha="right", va="bottom", fontsize=8)
    ax.set(xlabel="step", ylabel="log10(‖Δp‖ / ‖p‖)", title="Update-to-data ratio per parameter")
    return ax


def _per_parameter(ax: Axes, series: Mapping[str, tuple[np.ndarray, np.ndarray]], label: str,
                   style: str, *, log: bool, missing: Any, missing_text: str) -> None:
    prefix = f"{label}, " if label else ""
    colours = _colours(list(series))
    gaps = False
    for name, (steps, values) in series.items():
        absent = missing(values)
        shown = np.where(absent, np.nan, values)
        ax.plot(steps, shown, style, color=colours[name], label=f"{prefix}{name}")
        if absent.any():
            gaps = True
            ax.plot(steps[absent], np.zeros(absent.sum()), "v", color=colours[name], ms=5,
                    transform=ax.get_xaxis_transform(), clip_on=False)
    if log and np.isfinite([v for _, vs in series.values() for v in vs if v > 0]).any():
        ax.set_yscale("log")
    if gaps:
        ax.plot([], [], "v", color="gray", label=f"▼ {missing_text}")
    if series:
        ax.legend(fontsize=7)


def summary_lines(records: Records, losses: Records = (), total: int | None = None,
                  rate: float | None = None) -> list[str]:
    """The status panel: where the run is, and the latest numbers."""
    if not records and not losses:
        return ["starting: building the model, the batches and the first evaluation"]
    step = max([r["step"] for r in records] + [r["step"] for r in losses])
    lines = [f"step {step:,}" + (f" of {total:,}" if total else "")]
    if rate and total:
        lines[0] += f"  ·  {rate:,.0f} steps/s  ·  about {max(total - step, 0) / rate:,.0f} s left"
    train = [r["train_loss"] for r in losses if r.get("train_loss") is not None]
    held = [r["held_out_loss"] for r in losses if r.get("held_out_loss") is not None]
    loss = train[-1] if train else records[-1]["loss"] if records else None
    parts = ([f"training loss {loss:.3f}"] if loss is not None else []) + \
        ([f"held-out loss {held[-1]:.3f}"] if held else [])
    if parts:
        lines.append(",  ".join(parts))
    if records:
        last = records[-1]
        lines.append(f"at step {last['step']:,}:")
        for name, stats in last["activations"].items():
            lines.append(f"  {name}: {stats['saturated']:.1%} saturated, "
                         f"{stats['dead']:.1%} dead units")
        for name, stats in last["parameters"].items():
            ratio = stats.get("update_ratio")
            lines.append(f"  {name}: ‖grad‖ {stats['grad_norm']:.2g}, ratio "
                         + ("none (no update)" if ratio is None else f"{ratio:+.2f}"))
    return lines


def draw(fig: Figure, records: Records, losses: Records = (), *, title: str | None = None,
         total: int | None = None, rate: float | None = None) -> Figure:
    """The six panels on `fig` (cleared first): loss, activation histograms, saturation,
    gradient norms, update-to-data ratios, and the status in words."""
    fig.clear()
    axes = fig.subplots(2, 3)
    plot_loss(records, axes[0, 0], losses=losses)
    plot_histograms(records, axes[0, 1])
    plot_saturation(records, axes[0, 2])
    plot_grad_norms(records, axes[1, 0])
    plot_update_ratios(records, axes[1, 1])
    status = axes[1, 2]
    status.axis("off")
    status.text(0.0, 1.0, "\n".join(summary_lines(records, losses, total, rate)),
                va="top", ha="left", fontsize=8.5, family="monospace", transform=status.transAxes)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def figure(records: Records, losses: Records = (), *, title: str | None = None,
           size: tuple[float, float] = SIZE) -> Figure:
    """A new pyplot-free Figure with the dashboard drawn on it."""
    from matplotlib.figure import Figure

    return draw(Figure(figsize=size, layout="constrained"), records, losses, title=title)


# live, in a notebook ---------------------------------------------------------------------------
class LiveDashboard:
    """The observer a notebook passes to `train(config, observer=...)`: a HealthMonitor plus
    one figure that is redrawn in place (an IPython display handle, updated) whenever a new
    sample arrives, at most every `interval` seconds and once at the end (under `train`, on
    its log lines only, whose time is not counted as training time). The figure is also
    the cell's progress display: it appears when training starts, with the step, the speed
    and the time left."""

    def __init__(self, every: int = HEALTH_EVERY, model: Any = None, *, steps: int | None = None,
                 title: str | None = None, interval: float = 5.0, size: tuple[float, float] = SIZE,
                 dpi: int = 100, monitor: HealthMonitor | None = None) -> None:
        from matplotlib.figure import Figure

        self.monitor = monitor or HealthMonitor(every, model)
        self.steps, self.title, self.interval, self.dpi = steps, title, interval, dpi
        self.fig = Figure(figsize=size, layout="constrained")
        self.redraws = 0
        self._handle: Any = None
        self._last = -math.inf
        self._drawn = -1  # how many health records the displayed figure shows
        self._step = 0  # the last step the loop announced
        self._recorded = -1  # the step of the last history record received

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.monitor.records

    def wants(self, step: int) -> bool:
        if step <= self._step:  # a new run (its cell run again): start over, not merge the two
            self.restart()
        self._step = step
        if not self.redraws:  # training has started: show the (empty) dashboard at once
            self.redraw()
        return self.monitor.wants(step)

    def after_backward(self, tape: Any, loss_var: Any, grads: Any) -> None:
        self.monitor.after_backward(tape, loss_var, grads)

    def after_update(self) -> None:
        self.monitor.after_update()
        if not self.monitor.losses:  # a loop without history records: redraw from here
            self._maybe_redraw()

    def on_history(self, records: Sequence[Mapping[str, Any]]) -> None:
        """The run's history before its first step (`train` passes it): step 0's held-out loss,
        ln 257 for a fresh model, is the curve's first point, as in the run's own history."""
        for record in records:
            self.on_record(record)

    def on_record(self, record: Mapping[str, Any]) -> None:
        if record.get("step", 0) <= self._recorded:  # step 0 of a new run (its cell run again)
            self.restart()
        self._recorded = record.get("step", 0)
        self.monitor.on_record(record)
        last_step = self.steps is not None and record.get("step") == self.steps
        self.redraw() if last_step else self._maybe_redraw()

    def restart(self) -> None:
        """Forget the last run: the next one is drawn alone, in the output of its own cell."""
        self.monitor.restart()
        self._handle, self.redraws, self._drawn, self._last, self._step = None, 0, -1, -math.inf, 0
        self._recorded = -1

    def _maybe_redraw(self) -> None:
        # Only for new health samples, and not too often: every redraw sends a whole PNG to
        # the notebook, and a slow machine must not flood it with them.
        fresh = len(self.monitor.records) != self._drawn
        if fresh and time.perf_counter() - self._last >= self.interval:
            self.redraw()

    def redraw(self) -> None:
        """Draw the figure now and replace the displayed image with it."""
        from IPython.display import Image, display

        draw(self.fig, self.monitor.records, self.monitor.losses, title=self.title,
             total=self.steps, rate=self.monitor.rate())
        buffer = io.BytesIO()
        self.fig.savefig(buffer, format="png", dpi=self.dpi)
        image = Image(data=buffer.getvalue(), format="png")
        if self._handle is not None:
            self._handle.update(image)
        elif not self.redraws:  # outside a notebook display() gives no handle: show it once
            self._handle = display(image, display_id=True)
        self.redraws += 1
        self._drawn = len(self.monitor.records)
        self._last = time.perf_counter()

"""Matplotlib views for the notebooks, the widgets and figures/.

The 2-2-1 network with every number of one step on it (from a toy.StepRecord), its loss
against steps, the learning-rate cliff, and `plot_curves` for any set of training curves.
Each function draws on `ax` (or a new pyplot figure) and returns the Axes (`plot_step`, two
panels, returns the Figure); nothing here computes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...errors import fmt

if TYPE_CHECKING:  # plots only read records and scans, they never train
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ...models.toy import LrScan, StepRecord

LIVE = "#dcebf7"  # fill of a live unit
DEAD = "#d9d9d9"  # fill of a dead unit
GRAD = "#c0392b"  # gradients are written in this colour everywhere
DEAD_COLOURS = {0: "#2e86c1", 1: "#e67e22", 2: "#c0392b"}  # dead hidden units: 0, 1, 2

# Unit positions in data coordinates: inputs, hidden units, output.
_INPUT = [(0.0, 1.3), (0.0, -1.3)]
_HIDDEN = [(4.2, 1.3), (4.2, -1.3)]
_OUTPUT = (8.4, 0.0)
_RADIUS = 0.42
LEAKY = "#fdf2d0"  # fill of a leaky unit below zero: it still passes a little gradient
STEP_FIGSIZE = (8.0, 7.0)  # inches: the network above its loss curve, 800 px wide at 100 dpi


def axes_or_new(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    """`ax`, or the Axes of a new pyplot figure of `figsize` (every plot_* of lessons/ takes
    its data first and `ax` after it)."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt  # only when the caller gives no Axes

    _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def _unit(ax: Axes, xy: tuple[float, float], name: str, dead: bool = False,
          leaky: bool = False) -> None:
    from matplotlib.patches import Circle

    ax.add_patch(Circle(xy, _RADIUS, facecolor=DEAD if dead else LEAKY if leaky else LIVE,
                        edgecolor="#7f7f7f" if dead else "#b9770e" if leaky else "#1f4e79",
                        lw=1.5, ls="--" if leaky else "-", hatch="///" if dead else None,
                        zorder=3, gid=f"unit-{name}"))
    ax.text(*xy, name, ha="center", va="center", fontsize=12, zorder=4,
            color="#555555" if dead else "black")


def _edge(ax: Axes, start: tuple[float, float], end: tuple[float, float], name: str,
          weight: float, grad: float, at: float, dead: bool) -> None:
    """An arrow from `start` to `end`, with the weight above and its gradient below a point
    `at` of the way along. An edge touching a dead unit is grey and dashed: no gradient."""
    (x0, y0), (x1, y1) = start, end
    d = np.hypot(x1 - x0, y1 - y0)
    ux, uy = (x1 - x0) / d, (y1 - y0) / d
    ax.annotate("", xy=(x1 - ux * _RADIUS, y1 - uy * _RADIUS),
                xytext=(x0 + ux * _RADIUS, y0 + uy * _RADIUS),
                arrowprops=dict(arrowstyle="-|>", color="#9a9a9a" if dead else "#1f4e79",
                                lw=1.2, ls="--" if dead else "-", shrinkA=0, shrinkB=0),
                zorder=1)
    px, py = x0 + at * (x1 - x0), y0 + at * (y1 - y0)
    # Two opaque boxes that touch, centred on the edge: the arrow stops at the label instead
    # of running through its text.
    box = dict(boxstyle="round,pad=0.2", fc="white", ec="none")
    ax.text(px, py, f"{name} = {fmt(weight)}", ha="center", va="bottom", fontsize=9,
            bbox=box, zorder=2, gid=f"label-{name}")
    ax.text(px, py, f"∂L/∂w = {fmt(grad)}", ha="center", va="top", fontsize=9,
            color="#7f7f7f" if dead else GRAD, bbox=box, zorder=2, gid=f"grad-{name}")


def draw_network(record: StepRecord, ax: Axes | None = None, *,
                 title: str | None = None) -> Axes:
    """The 2-2-1 network of one step with every number on it: inputs, pre-activations and
    activations on the units, each weight and the gradient reaching it on its edge, the
    output and the loss; dead hidden units greyed, hatched and labelled."""
    ax = axes_or_new(ax, (10.5, 4.7))
    dead = record.dead
    leaky = tuple(b and not d for b, d in zip(record.below_zero, dead))
    # Input → hidden: W1[j, i] joins input i to hidden unit j. The two crossing edges carry
    # their labels near the inputs and the straight ones mid-way, so no two labels meet.
    for i, start in enumerate(_INPUT):
        for j, end in enumerate(_HIDDEN):
            _edge(ax, start, end, f"W¹{'₁₂'[j]}{'₁₂'[i]}", record.W1[j, i], record.dW1[j, i],
                  at=0.5 if i == j else 0.3, dead=dead[j])
    for j, start in enumerate(_HIDDEN):
        _edge(ax, start, _OUTPUT, f"W²{'₁₂'[j]}", record.W2[j], record.dW2[j], at=0.5,
              dead=dead[j])

    for i, xy in enumerate(_INPUT):
        _unit(ax, xy, f"x{'₁₂'[i]}")
        ax.text(xy[0] - _RADIUS - 0.15, xy[1], f"x{'₁₂'[i]} = {fmt(record.x[i])}",
                ha="right", va="center", fontsize=10)
    for j, xy in enumerate(_HIDDEN):
        _unit(ax, xy, f"h{'₁₂'[j]}", dead=dead[j], leaky=leaky[j])
        above = j == 0  # h1's numbers go above it, h2's below: away from every edge
        act = "ReLU(z)" if not record.slope else "leaky(z)"
        lines = [f"z = {fmt(record.z1[j])}   a = {act} = {fmt(record.a1[j])}",
                 f"∂L/∂a = {fmt(record.da1[j])}   ∂L/∂z = {fmt(record.dz1[j])}"]
        if dead[j]:
            lines.insert(0 if above else 2, "DEAD: z ≤ 0, no gradient passes")
        elif leaky[j]:
            lines.insert(0 if above else 2, f"z ≤ 0, leaky: passes {fmt(record.slope)} × ∂L/∂a")
        y = xy[1] + (_RADIUS + 0.12) * (1 if above else -1)
        ax.text(xy[0], y, "\n".join(lines), ha="center", va="bottom" if above else "top",
                fontsize=9.5, linespacing=1.4,
                color="#a93226" if dead[j] else "#9a5b00" if leaky[j] else "black")
    _unit(ax, _OUTPUT, "ŷ")
    ax.text(_OUTPUT[0] + _RADIUS + 0.2, _OUTPUT[1],
            f"ŷ = {fmt(record.y_hat)}\ny = {fmt(record.y)}\nL = ½(ŷ − y)² = {fmt(record.loss, 5)}"
            f"\n∂L/∂ŷ = {fmt(record.dy_hat)}",
            ha="left", va="center", fontsize=10, linespacing=1.5)

    if title is None:
        when = "initial weights" if record.step == 0 else f"after {record.step} step" + \
            ("s" if record.step > 1 else "")
        rate = f" · learning rate {fmt(record.lr)}" if record.lr else ""  # 0: no training yet
        title = (f"step {record.step} ({when}){rate} · "
                 f"loss {fmt(record.loss, 5)} · dead units {record.dead_count}/2")
    ax.set_title(title, fontsize=11)
    ax.text(0.5, 0.0, "on each edge: the weight (W¹ⱼᵢ joins input i to hidden unit j) and, in red, "
            "the gradient ∂L/∂w reaching it",
            transform=ax.transAxes, ha="center", va="bottom", fontsize=8.5, color="#555555")
    ax.set_xlim(-1.9, 11.9)
    ax.set_ylim(-3.5, 3.25)  # room for three lines of numbers above h₁ and below h₂
    ax.set_aspect("equal")
    ax.axis("off")
    return ax


def plot_loss(records: Sequence[StepRecord], ax: Axes | None = None, *,
              highlight: int | None = None) -> Axes:
    """Loss against step for one run, each point coloured by how many hidden units are dead;
    `highlight` circles one step (the one a network figure beside it shows)."""
    from matplotlib.ticker import MaxNLocator

    ax = axes_or_new(ax, (5.5, 3.6))
    steps = np.array([r.step for r in records])
    loss = np.array([r.loss for r in records])
    dead = np.array([r.dead_count for r in records])
    lr = records[0].lr if records else 0.0
    ax.plot(steps, loss, color="#7f7f7f", lw=1.2, zorder=1,
            label=f"learning rate {fmt(lr)}")
    for n, colour in DEAD_COLOURS.items():
        keep = dead == n
        if keep.any():
            ax.scatter(steps[keep], loss[keep], color=colour, s=22, zorder=2,
                       label=f"{n} dead unit{'s' if n != 1 else ''}")
    if highlight is not None and 0 <= highlight < len(records):
        ax.scatter([steps[highlight]], [loss[highlight]], s=140, facecolor="none",
                   edgecolor="black", lw=1.5, zorder=3, label=f"step {highlight}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("loss ½(ŷ − y)²")
    ax.set_title(f"loss against step, learning rate {fmt(lr)}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def plot_step(records: Sequence[StepRecord], step: int, fig: Figure | None = None) -> Figure:
    """The network at `step` beside the loss of the whole run, that step circled: what the
    learning-rate widget shows. Draws on `fig` (a new pyplot figure if None)."""
    if fig is None:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=STEP_FIGSIZE, layout="constrained")
    grid = fig.add_gridspec(2, 1, height_ratios=[1.75, 1.0])  # stacked: legible at 800 px
    draw_network(records[step], fig.add_subplot(grid[0]))
    plot_loss(records, fig.add_subplot(grid[1]), highlight=step)
    return fig


def unit_marks(fig: Figure) -> list[dict]:
    """What the figure drew for each unit, read back from its artists after a draw: name,
    fill, hatch, dead-or-alive style, and its centre and radius in the pixels of a PNG saved
    at fig.dpi. The widget publishes this beside the picture for the browser test."""
    from matplotlib.colors import to_hex

    height = fig.bbox.height
    marks = []
    for ax in fig.axes:
        for patch in ax.patches:
            gid = patch.get_gid() or ""
            if not gid.startswith("unit-"):
                continue
            (cx, cy), (ex, _) = ax.transData.transform(
                [patch.center, (patch.center[0] + patch.radius, patch.center[1])])
            marks.append({"name": gid[5:], "fill": to_hex(patch.get_facecolor()),
                          "hatch": patch.get_hatch() or "", "x": round(float(cx), 1),
                          "y": round(float(height - cy), 1), "r": round(float(ex - cx), 1)})
    return marks


def plot_cliff(scan: LrScan, ax: Axes | None = None, *,
               cliff: float | None = None) -> Axes:
    """Final loss against learning rate (log x axis), each point coloured by the dead units
    at the end; a dashed line marks the cliff (`cliff`, or the scan's own estimate)."""
    ax = axes_or_new(ax, (7.5, 4.2))
    ax.plot(scan.lrs, scan.final_loss, color="#9a9a9a", lw=1, zorder=1)
    for n, colour in DEAD_COLOURS.items():
        keep = scan.dead_count == n
        if keep.any():
            ax.scatter(scan.lrs[keep], scan.final_loss[keep], color=colour, s=14, zorder=2,
                       label=f"{n} dead hidden unit{'s' if n != 1 else ''} at the end")
    ax.axhline(0.5, color=DEAD_COLOURS[2], ls=":", lw=1)
    ax.text(scan.lrs[0], 0.5, " ŷ = 0 for good: L = ½(0 − 1)² = 0.5", va="bottom",
            fontsize=8.5, color=DEAD_COLOURS[2])
    edge = scan.cliff if cliff is None else cliff
    if edge is not None:
        ax.axvline(edge, color="black", ls="--", lw=1)
        ax.text(edge, 0.25, f"cliff ≈ {edge:.3g} ", ha="right", va="center", fontsize=9)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate η (log scale)")
    ax.set_ylabel(f"loss after {scan.steps} steps")
    ax.set_title("The learning-rate cliff of the 2-2-1 network", fontsize=11)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, 0.93))
    return ax


def plot_curves(curves: Mapping[str, tuple[Sequence[float], Sequence[float]] | Sequence[float]],
                ax: Axes | None = None, *, title: str | None = None, xlabel: str = "step",
                ylabel: str = "loss", logy: bool = False, smooth: int = 1,
                hline: Mapping[str, float] | None = None, markers: Sequence[str] = ()) -> Axes:
    """One line per named curve: `{"MLP": (steps, losses), "bigram": (steps, losses)}`; a bare
    sequence of losses is plotted against 0, 1, 2, ... `smooth` > 1 draws a moving average
    over that many points over the faint raw curve; `hline` adds labelled reference levels
    (e.g. {"ln 257": 5.549}); the curves named in `markers` get a dot on every point (a curve
    measured every few hundred steps, where the line alone hides how few points it has)."""
    ax = axes_or_new(ax, (7.0, 4.2))
    for k, (name, curve) in enumerate(curves.items()):
        if isinstance(curve, tuple) and len(curve) == 2:
            steps, losses = (np.asarray(c, dtype=np.float64).reshape(-1) for c in curve)
        else:
            losses = np.asarray(curve, dtype=np.float64).reshape(-1)
            steps = np.arange(losses.size, dtype=np.float64)
        colour = f"C{k % 10}"
        if smooth > 1 and losses.size >= smooth:
            ax.plot(steps, losses, color=colour, alpha=0.25, lw=0.8)
            kernel = np.ones(smooth) / smooth
            ax.plot(steps[smooth - 1:], np.convolve(losses, kernel, mode="valid"),
                    color=colour, lw=1.6, label=name)
        else:
            dots = {"marker": "o", "markersize": 3.5} if name in markers else {}
            ax.plot(steps, losses, color=colour, lw=1.6, label=name, **dots)
    for name, level in (hline or {}).items():
        ax.axhline(level, color="#555555", ls=":", lw=1)
        ax.annotate(f"{name} ", (0.995, level), xycoords=("axes fraction", "data"),
                    ha="right", va="bottom", fontsize=8, color="#555555")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(fontsize=9)
    return ax

"""What notebook 14 looks through: the formats' bits drawn, and where a model's numbers lie
against each format's range; its short runs in each precision are short_runs.py's.

The numbers come from the package (backends/precision.py, the tape); this module only gathers
and draws them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...autodiff.tape import Tape
from ...backends.precision import FORMATS
from .short_runs import LESSON_FACTOR, LESSON_MODEL, short_run

__all__ = ["draw_formats", "draw_ranges", "snapshot", "Snapshot", "short_run", "LESSON_FACTOR",
           "LESSON_MODEL"]

COLOURS = {"sign": "#d62728", "exponent": "#1f77b4", "mantissa": "#2ca02c"}


def draw_formats(ax: Any) -> None:
    """One row of boxes per format: its sign, exponent and mantissa bits, to scale."""
    for row, f in enumerate(FORMATS.values()):
        y = len(FORMATS) - 1 - row
        kinds = ["sign"] + ["exponent"] * f.exponent + ["mantissa"] * f.mantissa
        for k, kind in enumerate(kinds):
            ax.add_patch(_box(k, y, COLOURS[kind]))
        ax.text(-0.8, y + 0.4, f.name, ha="right", va="center", fontsize=11, weight="bold")
        ax.text(len(kinds) + 0.6, y + 0.4, f"{f.bits} bits: 1 + {f.exponent} + {f.mantissa}",
                va="center", fontsize=9)
    for kind, colour in COLOURS.items():
        ax.plot([], [], "s", color=colour, label=kind)
    ax.set_xlim(-5, 42)
    ax.set_ylim(-0.4, len(FORMATS) + 0.2)
    ax.axis("off")
    ax.legend(loc="upper right", ncol=3, frameon=False, fontsize=9)


def _box(x: float, y: float, colour: str) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 0.9, 0.8, color=colour)


@dataclass
class Snapshot:
    """Every number one training step of a model holds, by kind, as |x| (zeros left out)."""

    activations: np.ndarray
    weights: np.ndarray
    gradients: np.ndarray  # of every node that feeds a matrix product: what a GEMM reads
    zeros: dict[str, float] = field(default_factory=dict)  # fraction exactly 0 before rounding

    def flushed(self, precision: str) -> float:
        """The fraction of the gradients that rounding to `precision` turns into zero."""
        return float(np.mean(self.gradients < FORMATS[precision].smallest / 2))

    def subnormal(self, precision: str) -> float:
        """The fraction that lands below the format's smallest normal number (fewer bits)."""
        f = FORMATS[precision]
        return float(np.mean((self.gradients >= f.smallest / 2) & (self.gradients < f.tiny)))


def snapshot(model: Any, contexts: np.ndarray, targets: np.ndarray, loss_factor: float = 1.0
             ) -> Snapshot:
    """Record one forward and backward of `model` (float32) and gather its numbers."""
    tape = Tape(model.parameters()[0].backend)
    loss = model.loss(tape, contexts, targets)
    grads = tape.backward(tape.mul(loss, loss_factor))
    # what the products read: a matmul's two inputs, a linear's x and W (a GPU tape's Linears)
    fed = {i for node in tape.nodes if node.op in ("matmul", "linear") for i in node.inputs[:2]}
    acts = [node.value for node in tape.nodes if node.op is not None]
    grad_values = [grads.node(i) for i in sorted(fed) if grads.node(i) is not None]

    def nonzero(arrays: list) -> tuple[np.ndarray, float]:
        flat = np.abs(np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays]))
        return flat[flat > 0], float(np.mean(flat == 0))

    (a, za), (w, zw), (g, zg) = (nonzero(x) for x in (acts, [p.value for p in model.parameters()],
                                                       grad_values))
    return Snapshot(a, w, g, {"activations": za, "weights": zw, "gradients": zg})


def draw_ranges(ax: Any, snap: Snapshot) -> None:
    """Histograms of log₂|x| for each kind, with fp16's and bf16's limits marked."""
    bins = np.arange(-60, 20, 1.0)
    for name, values, colour in (("activations", snap.activations, "#1f77b4"),
                                 ("weights", snap.weights, "#2ca02c"),
                                 ("gradients (what a GEMM reads)", snap.gradients, "#d62728")):
        ax.hist(np.log2(values), bins=bins, histtype="step", lw=1.6, color=colour, label=name,
                density=True)
    for value, text, style in ((FORMATS["fp16"].smallest, "fp16 smallest", ":"),
                               (FORMATS["fp16"].tiny, "fp16 smallest normal", "--"),
                               (FORMATS["fp16"].max, "fp16 max", "-")):
        ax.axvline(np.log2(value), color="k", ls=style, lw=1)
        ax.text(np.log2(value) + 0.5, ax.get_ylim()[1] * 0.9, text, rotation=90, va="top", fontsize=8)
    ax.set_xlabel("log₂ |x|  (bf16 and fp32 reach from −133 / −149 to +128)")
    ax.set_ylabel("share of the numbers")
    ax.legend(loc="upper left", fontsize=8)

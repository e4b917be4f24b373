"""What a tape holds: bytes per node and per op, the total kept for backward, the peak (lesson 15).

`tape.memory()` counts every buffer once (a reshape or transpose view shares its input's), gives
each to the first node that holds it, and adds what an operation saved beside its output (the
fused attention's log-sum-exp). Counts come from shapes and dtypes, so CPU and GPU agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _root(x: Any) -> Any:
    """The array that owns x's memory (NumPy and CuPy views both keep it as `.base`)."""
    while getattr(x, "base", None) is not None and hasattr(x.base, "nbytes"):
        x = x.base
    return x


class _Buffers:
    """Counts each buffer once: `add(x)` gives x's bytes the first time its memory is seen."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.keep: list[Any] = []  # ids stay unique only while their arrays are alive

    def add(self, x: Any) -> int:
        if x is None or not hasattr(x, "nbytes"):
            return 0
        root = _root(x)
        if id(root) in self.seen:
            return 0
        self.seen.add(id(root))
        self.keep.append(root)
        return int(root.nbytes)


@dataclass(frozen=True)
class NodeMemory:
    index: int
    op: str  # the node's rule name, or "leaf" / "constant"
    shape: tuple[int, ...]
    bytes: int  # the buffers this node is the first to hold (0 for a view of an earlier node)
    saved: int  # what its operation keeps beside the output (log-sum-exp, ...)


@dataclass
class MemoryReport:
    """`kept` is what backward reads that the tape alone holds: every computed node's value and
    saved state (leaves and constants, the parameters and the batch, live outside it: `leaves`).
    `gradients` is what backward's result holds; `peak` the most alive at once during backward,
    values + gradients so far + a checkpoint's recomputed segment (rules' temporaries left out)."""

    nodes: list[NodeMemory]
    leaves: int
    kept: int
    gradients: int | None  # None before backward
    peak: int | None
    by_op: dict[str, int] = field(default_factory=dict)

    def largest(self, n: int = 5) -> list[NodeMemory]:
        """The n nodes that hold the most bytes, largest first."""
        return sorted((m for m in self.nodes if m.op not in ("leaf", "constant")),
                      key=lambda m: -(m.bytes + m.saved))[:n]

    def table(self, n: int = 8) -> str:
        lines = [f"{'op':<14} {'bytes kept':>12}"]
        for op, b in sorted(self.by_op.items(), key=lambda kv: -kv[1])[:n]:
            lines.append(f"{op:<14} {b:>12,}")
        lines.append(f"{'kept':<14} {self.kept:>12,}")
        if self.peak is not None:
            lines.append(f"{'peak':<14} {self.peak:>12,}")
        return "\n".join(lines)


def saved_tensors(node: Any) -> tuple:
    """The tensors a node's operation keeps besides its value (`Operation.saved`)."""
    return tuple(t for a in node.args for t in getattr(a, "saved", ()) or ())


def memory(tape: Any) -> MemoryReport:
    """Count what `tape` holds now (see MemoryReport); after backward, its gradients and peak."""
    buffers, rows, by_op = _Buffers(), [], {}
    leaves = kept = 0
    for k, node in enumerate(tape.nodes):
        own = buffers.add(node.value)
        saved = sum(buffers.add(t) for t in saved_tensors(node))
        rows.append(NodeMemory(k, node.name, tuple(node.shape), own, saved))
        if node.op is None:
            leaves += own
        else:
            kept += own + saved
            by_op[node.op] = by_op.get(node.op, 0) + own + saved
    grads = tape.gradients
    if grads is None:
        return MemoryReport(rows, leaves, kept, None, None, by_op)
    total, peak = _peak(tape, grads)
    return MemoryReport(rows, leaves, kept, total, kept + leaves + peak, by_op)


def _peak(tape: Any, grads: Any) -> tuple[int, int]:
    """(bytes of all gradients, the most held beside the values at any step of the walk).
    A node's gradient appears when its last consumer's rule runs (the walk goes backwards) and
    stays in backward's result; a checkpoint's recomputed segment lives during its own rule."""
    nodes = tape.nodes
    appears = list(range(len(nodes)))  # the loss's gradient exists from the start
    for i, node in enumerate(nodes):
        for j in node.inputs:
            appears[j] = max(appears[j], i)
    buffers, by_step = _Buffers(), {}
    for j in sorted(range(len(nodes)), key=lambda j: -appears[j]):
        b = buffers.add(grads.node(j))
        by_step[appears[j]] = by_step.get(appears[j], 0) + b
    held = peak = 0
    for i in range(len(nodes) - 1, -1, -1):
        held += by_step.get(i, 0)
        transient = sum(getattr(a, "recomputed", 0) for a in nodes[i].args)
        peak = max(peak, held + transient)
    return held, peak

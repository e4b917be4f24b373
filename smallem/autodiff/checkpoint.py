"""Checkpointing: a segment of the forward recorded as one node that keeps only its inputs.

`checkpoint(tape, fn, *inputs)` runs `fn(inner_tape, *vars)` on a tape of its own, keeps the
output, and lets that tape go; its rule runs the segment again on a new tape and differentiates
it there (as torch.utils.checkpoint). Same arithmetic in the same order: the gradients are the
unsegmented run's, bit for bit on the CPU. Lesson 15; the Transformer's `checkpoint_blocks`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..backends import Backend, Tensor
from ..errors import SmallemError
from .operations import Operation, register


@register
class Checkpoint(Operation):
    """y = fn(x₁, …, parameters) recorded as one node; inputs: the segment's inputs, then the
    parameters of `module` (a Module, or None when fn reads none)."""

    name = "checkpoint"

    def __init__(self, fn: Callable[..., Any], count: int, parameters: Sequence[Any] = (),
                 rules: dict | None = None, fused: bool = True) -> None:
        self.fn, self.count, self.parameters = fn, count, list(parameters)
        self.rules, self.fused = rules, fused
        self.recomputed = 0  # bytes the segment held while its rule ran (tape.memory's peak)

    def run(self, be: Backend, values: Sequence[Tensor]) -> tuple[Any, list[Any], Any]:
        """The segment on a new tape: (tape, its leaves, output Var). The parameters get the
        values recorded on the outer tape (bound as leaves, so param.var finds them)."""
        from .tape import Tape

        tape = Tape(be, rules=self.rules, fused=self.fused)
        leaves = [tape.leaf(v) for v in values]
        for param, leaf in zip(self.parameters, leaves[self.count:]):
            tape.bindings[param] = leaf.index
        out = self.fn(tape, *leaves[:self.count])
        given = {id(p) for p in self.parameters}
        missed = [p for p in tape.bindings if id(p) not in given]
        if missed:  # read on the inner tape only: no gradient would reach them (trained frozen)
            shapes = ", ".join(str(list(p.shape)) for p in missed[:3])
            raise SmallemError(f"checkpoint: the segment reads {len(missed)} parameter(s) that are "
                               f"not its inputs (shapes {shapes}{', ...' if len(missed) > 3 else ''})"
                               ", so they would receive no gradient and train frozen: pass the "
                               "Module it reads, checkpoint(tape, block, x, module=block)")
        if getattr(out, "tape", None) is not tape:
            raise SmallemError("checkpoint: the segment must return a Var of the tape it is "
                               "given (fn(tape, *inputs) -> Var)")
        return tape, leaves, out

    def forward(self, be: Backend, *inputs: Tensor) -> Tensor:
        tape, _, out = self.run(be, inputs)
        value = tape.value(out)
        tape.close()  # nothing of the segment is kept but its output
        return value

    def backward(self, be: Backend, grad: Tensor, out: Tensor, *inputs: Tensor) -> tuple:
        """dxᵢ = the segment's own backward from dy, after running its forward again"""
        tape, leaves, y = self.run(be, inputs)
        grads = tape.backward(y, grad=grad)
        report = tape.memory()  # its leaves are the outer tape's values: counted there
        self.recomputed = (report.peak or 0) - report.leaves
        return tuple(grads.get(leaf) for leaf in leaves)


def checkpoint(tape: Any, fn: Callable[..., Any], *inputs: Any, module: Any = None) -> Any:
    """`fn(tape, *inputs)` as one node that keeps only its inputs; `module`'s parameters (a
    Module that fn reads, e.g. a Transformer block: `checkpoint(tape, block, x, module=block)`)
    become inputs of the node, so they receive their gradients."""
    parameters = module.parameters() if module is not None else []
    op = Checkpoint(fn, len(inputs), parameters, tape.rules, tape.fused)
    return tape.apply(op, [*inputs, *(p.var(tape) for p in parameters)])

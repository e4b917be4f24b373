"""What a tape holds: a Node per recorded value (its value, the rule that made it, its inputs by
index) and a Var, the handle a lesson holds on one node of one tape, whose operators record the
tape's primitives (primitives.py) so that `a * b + a` builds the graph."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SmallemError, fmt

if TYPE_CHECKING:
    from ..backends import Tensor


@dataclass(frozen=True, eq=False)
class Var:
    """A handle on one node of one tape: the tape and the node's index in its list."""

    tape: Any  # the Tape (tape.py) that recorded the node
    index: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Var) and other.tape is self.tape and other.index == self.index

    def __hash__(self) -> int:
        return hash((self.tape.id, self.index))

    def __repr__(self) -> str:  # print(loss): the value first (of a tensor, a few numbers)
        node = self.tape.nodes[self.index]
        shown = node.value if np.prod(node.shape) <= 12 else node.value.reshape(-1)[:7]
        return (f"Var({fmt(self.tape.backend.to_numpy(shown), digits=6)}, op={node.name}, "
                f"shape={node.shape}, tape={self.tape.id}, index={self.index})")

    def __float__(self) -> float:  # float(loss): the one number a Var holds (syncs a GPU)
        if np.prod(self.shape) != 1:
            raise SmallemError(f"float() takes a Var holding one number; this one has shape "
                               f"{list(self.shape)}: index it or reduce it first (e.g. .sum())")
        return float(self.tape.backend.item(self.value))

    @property
    def value(self) -> Tensor:
        return self.tape.nodes[self.index].value

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tape.nodes[self.index].shape

    # Operators, so that lessons can write `a * b + a`; each is a tape primitive. NumPy must
    # defer to them: without this, `np.array(...) * var` builds an object array of Vars.
    __array_ufunc__ = None

    def __add__(self, o): return self.tape.add(self, o)
    def __radd__(self, o): return self.tape.add(o, self)
    def __sub__(self, o): return self.tape.sub(self, o)
    def __rsub__(self, o): return self.tape.sub(o, self)
    def __mul__(self, o): return self.tape.mul(self, o)
    def __rmul__(self, o): return self.tape.mul(o, self)
    def __truediv__(self, o): return self.tape.div(self, o)
    def __rtruediv__(self, o): return self.tape.div(o, self)
    def __matmul__(self, o): return self.tape.matmul(self, o)
    def __neg__(self): return self.tape.neg(self)
    def __pow__(self, exponent): return self.tape.power(self, exponent)


@dataclass(eq=False)
class Node:
    value: Tensor
    op: str | None  # the rule's name (a primitive or an operation); None for leaves/constants
    inputs: tuple[int, ...]
    args: tuple = ()  # the rule's extra arguments (a dim, a shape; an operation itself)
    requires_grad: bool = False
    shape: tuple[int, ...] = field(default=())

    @property
    def name(self) -> str:
        if self.op is None:
            return "leaf" if self.requires_grad else "constant"
        return self.op

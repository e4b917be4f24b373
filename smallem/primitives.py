"""The primitives: the few operations the tape knows by name, each forward followed by its rule.

`Tape` (tape.py) inherits these methods. A rule maps (backend, grad, out, *inputs, *args) to one
gradient (or None) per input; `backward` looks it up in RULES by the primitive's name. The list
is short and does not move: everything else is an Operation (operations.py) with its own rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .errors import SmallemError

if TYPE_CHECKING:
    from .tape import Var

RULES: dict[str, Callable[..., tuple]] = {}  # primitive name -> local rule


def rule(name: str) -> Callable:
    """Register the local rule of primitive `name`: (backend, grad, out, *inputs, *args) ->
    one gradient (or None) per input."""

    def register(fn: Callable) -> staticmethod:
        RULES[name] = fn
        return staticmethod(fn)

    return register


class Primitives:
    """The primitive operations of a Tape (a mixin: `self` is the Tape recording them)."""

    PRIMITIVES = ("add", "sub", "mul", "div", "neg", "matmul", "transpose", "reshape",
                  "broadcast_to", "sum", "mean", "exp", "log", "tanh", "sigmoid", "relu",
                  "square", "abs", "clip", "gather_rows")

    def _binary(self, name: str, a: Var | Any, b: Var | Any, forward: Callable) -> Var:
        i, j = self._index(a, name), self._index(b, name)
        sa, sb = self.nodes[i].shape, self.nodes[j].shape
        try:
            np.broadcast_shapes(sa, sb)
        except ValueError:
            raise SmallemError(
                f"{name}: shapes {list(sa)} and {list(sb)} do not broadcast; trailing "
                "dimensions must be equal or 1"
            ) from None
        return self._push(forward(self.nodes[i].value, self.nodes[j].value), name, (i, j))

    def _unary(self, name: str, a: Var, forward: Callable, *args: Any) -> Var:
        i = self._index(a, name)
        return self._push(forward(self.nodes[i].value, *args), name, (i,), args)

    # primitives: each forward, then its rule --------------------------------------------
    def add(self, a: Var | Any, b: Var | Any) -> Var:
        return self._binary("add", a, b, self.backend.add)

    @rule("add")  # c = a + b  →  da = dc, db = dc
    def _add(B, g, out, a, b):
        return g, g

    def sub(self, a: Var | Any, b: Var | Any) -> Var:
        return self._binary("sub", a, b, self.backend.sub)

    @rule("sub")  # c = a − b  →  da = dc, db = −dc
    def _sub(B, g, out, a, b):
        return g, B.neg(g)

    def mul(self, a: Var | Any, b: Var | Any) -> Var:
        return self._binary("mul", a, b, self.backend.mul)

    @rule("mul")  # c = a·b  →  da = dc·b, db = dc·a
    def _mul(B, g, out, a, b):
        return B.mul(g, b), B.mul(g, a)

    def div(self, a: Var | Any, b: Var | Any) -> Var:
        return self._binary("div", a, b, self.backend.div)

    @rule("div")  # c = a/b  →  da = dc/b, db = −dc·c/b
    def _div(B, g, out, a, b):
        da = B.div(g, b)
        return da, B.neg(B.mul(da, out))

    def neg(self, a: Var) -> Var:
        return self._unary("neg", a, self.backend.neg)

    @rule("neg")  # c = −a  →  da = −dc
    def _neg(B, g, out, a):
        return (B.neg(g),)

    def matmul(self, a: Var, b: Var) -> Var:
        i, j = self._index(a, "matmul"), self._index(b, "matmul")
        sa, sb = self.nodes[i].shape, self.nodes[j].shape
        if len(sa) < 2 or len(sb) < 2 or sa[-1] != sb[-2]:
            raise SmallemError(
                f"matmul: shapes {list(sa)} and {list(sb)} do not fit; both need two or more "
                f"dimensions and the last of the first ({sa[-1] if sa else '-'}) must equal "
                f"the second-to-last of the second ({sb[-2] if len(sb) > 1 else '-'})"
            )
        try:
            np.broadcast_shapes(sa[:-2], sb[:-2])
        except ValueError:
            raise SmallemError(
                f"matmul: batch dimensions of {list(sa)} and {list(sb)} do not broadcast"
            ) from None
        return self._push(self.backend.matmul(self.nodes[i].value, self.nodes[j].value),
                          "matmul", (i, j))

    @rule("matmul")  # C = A @ B  →  dA = dC @ Bᵀ, dB = Aᵀ @ dC (batch dims unbroadcast)
    def _matmul(B, g, out, a, b):
        return B.matmul(g, B.transpose(b, -1, -2)), B.matmul(B.transpose(a, -1, -2), g)

    def transpose(self, a: Var, dim0: int = -2, dim1: int = -1) -> Var:
        ndim = len(self.nodes[self._index(a, "transpose")].shape)
        for d in (dim0, dim1):
            if not -ndim <= d < ndim:
                raise SmallemError(f"transpose: dimension {d} is out of range for a "
                                   f"{ndim}-dimensional input")
        return self._unary("transpose", a, self.backend.transpose, dim0, dim1)

    @rule("transpose")  # swapping two dims is undone by swapping them back
    def _transpose(B, g, out, a, dim0, dim1):
        return (B.transpose(g, dim0, dim1),)

    def reshape(self, a: Var, shape: Sequence[int]) -> Var:
        old = self.nodes[self._index(a, "reshape")].shape
        shape = tuple(int(s) for s in shape)
        size, known = int(np.prod(old)), int(np.prod([s for s in shape if s != -1]))
        if shape.count(-1) == 1 and known > 0 and size % known == 0:
            shape = tuple(size // known if s == -1 else s for s in shape)  # infer the -1
        if size != int(np.prod(shape)) or any(s < 0 for s in shape):
            raise SmallemError(f"reshape: cannot reshape {list(old)} ({size} elements) into "
                               f"{list(shape)}")
        return self._unary("reshape", a, self.backend.reshape, shape)

    @rule("reshape")  # the gradient takes the input's shape back
    def _reshape(B, g, out, a, shape):
        return (B.reshape(g, B.shape(a)),)

    def broadcast_to(self, a: Var, shape: Sequence[int]) -> Var:
        old = self.nodes[self._index(a, "broadcast_to")].shape
        try:
            fits = np.broadcast_shapes(old, tuple(shape)) == tuple(shape)
        except ValueError:
            fits = False
        if not fits:
            raise SmallemError(f"broadcast_to: {list(old)} cannot be stretched to "
                               f"{list(shape)}")
        return self._unary("broadcast_to", a, self.backend.broadcast_to, tuple(shape))

    @rule("broadcast_to")  # stretching is using several times: the gradient is a sum
    def _broadcast_to(B, g, out, a, shape):
        return (g,)  # backward's unbroadcast does the summing

    def _check_dim(self, name: str, a: Var, dim: int | None) -> None:
        ndim = len(self.nodes[self._index(a, name)].shape)
        if dim is not None and not -ndim <= dim < ndim:
            raise SmallemError(f"{name}: dimension {dim} is out of range for a "
                               f"{ndim}-dimensional input")

    def sum(self, a: Var, dim: int | None = None, keepdim: bool = False) -> Var:
        self._check_dim("sum", a, dim)
        return self._unary("sum", a, self.backend.sum, dim, keepdim)

    @rule("sum")  # summing is the reverse of stretching: the gradient is a broadcast
    def _sum(B, g, out, a, dim, keepdim):
        if dim is not None and not keepdim:
            g = B.reshape(g, _keepdim_shape(B.shape(a), dim))
        return (B.broadcast_to(g, B.shape(a)),)

    def mean(self, a: Var, dim: int | None = None, keepdim: bool = False) -> Var:
        self._check_dim("mean", a, dim)
        return self._unary("mean", a, self.backend.mean, dim, keepdim)

    @rule("mean")  # a sum divided by the count n  →  da = broadcast(dc)/n
    def _mean(B, g, out, a, dim, keepdim):
        n = int(np.prod(B.shape(a))) if dim is None else B.shape(a)[dim]
        if dim is not None and not keepdim:
            g = B.reshape(g, _keepdim_shape(B.shape(a), dim))
        return (B.broadcast_to(B.div(g, float(n)), B.shape(a)),)

    def exp(self, a: Var) -> Var:
        return self._unary("exp", a, self.backend.exp)

    @rule("exp")  # c = eᵃ  →  da = dc·c (the output, already computed)
    def _exp(B, g, out, a):
        return (B.mul(g, out),)

    def log(self, a: Var) -> Var:
        return self._unary("log", a, self.backend.log)

    @rule("log")  # c = ln a  →  da = dc/a
    def _log(B, g, out, a):
        return (B.div(g, a),)

    def tanh(self, a: Var) -> Var:
        return self._unary("tanh", a, self.backend.tanh)

    @rule("tanh")  # c = tanh a  →  da = dc·(1 − c²)
    def _tanh(B, g, out, a):
        return (B.mul(g, B.sub(1.0, B.square(out))),)

    def sigmoid(self, a: Var) -> Var:
        return self._unary("sigmoid", a, self.backend.sigmoid)

    @rule("sigmoid")  # c = σ(a)  →  da = dc·c·(1 − c), never more than dc/4
    def _sigmoid(B, g, out, a):
        return (B.mul(g, B.mul(out, B.sub(1.0, out))),)

    def relu(self, a: Var) -> Var:
        return self._unary("relu", a, self.backend.relu)

    @rule("relu")  # c = max(a, 0)  →  da = dc where a > 0, else 0 (a dead unit passes nothing)
    def _relu(B, g, out, a):
        return (B.mul(g, B.positive(a)),)

    def square(self, a: Var) -> Var:
        return self._unary("square", a, self.backend.square)

    @rule("square")  # c = a²  →  da = 2a·dc
    def _square(B, g, out, a):
        return (B.mul(g, B.mul(a, 2.0)),)

    def abs(self, a: Var) -> Var:
        return self._unary("abs", a, self.backend.abs)

    @rule("abs")  # c = |a|  →  da = sign(a)·dc
    def _abs(B, g, out, a):
        return (B.mul(g, B.sign(a)),)

    def clip(self, a: Var, low: float, high: float) -> Var:
        if low > high:
            raise SmallemError(f"clip: low ({low}) is above high ({high})")
        return self._unary("clip", a, self.backend.clip, float(low), float(high))

    @rule("clip")  # c = clip(a, lo, hi)  →  da = dc inside [lo, hi], 0 outside: learning stops there
    def _clip(B, g, out, a, low, high):
        return (B.mul(g, B.inside(a, low, high)),)

    def gather_rows(self, table: Var, rows: Any) -> Var:
        """Row lookup `table[rows]` (an embedding): rows are integers, not a Var."""
        i = self._index(table, "gather_rows")
        shape = self.nodes[i].shape
        if len(shape) != 2:
            raise SmallemError(f"gather_rows: the table must be 2-D [rows, width], got {list(shape)}")
        host = np.asarray(rows.get() if hasattr(rows, "get") else rows)
        if host.size and (not np.issubdtype(host.dtype, np.integer) or host.min() < 0
                          or host.max() >= shape[0]):
            raise SmallemError(f"gather_rows: row indices must be integers in [0, {shape[0]}); "
                               f"got values from {host.min()} to {host.max()}")
        index = self.backend.indices(rows)
        return self._push(self.backend.gather_rows(self.nodes[i].value, index),
                          "gather_rows", (i,), (index,))

    @rule("gather_rows")  # read rows  →  scatter-add the gradient rows back (repeats sum)
    def _gather_rows(B, g, out, table, rows):
        return (B.scatter_add_rows(g, rows, B.shape(table)[0]),)


def _keepdim_shape(shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    dim = dim % len(shape)
    return shape[:dim] + (1,) + shape[dim + 1:]

"""The primitives: the few operations the tape knows by name, each forward followed by its rule.

`Tape` (tape.py) inherits these methods. A rule maps (be, grad, out, *inputs, *args) to one
gradient (or None) per input, its maths in its docstring's one line; `Tape.backward` looks it up
in RULES by name, the same table operations (operations.py) register their rules in. The two
records a primitive pushes and returns, Node and Var, are in nodes.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..backends.protocol import on_device
from ..errors import SmallemError
from .nodes import Node, Var

if TYPE_CHECKING:
    from ..backends import Backend

Rule = Callable[..., tuple]  # (be, grad, out, *inputs, *args) -> one gradient (or None) per input
RULES: dict[str, Rule] = {}  # name -> reference rule: every primitive, then every operation; its
# docstring's first line is its maths (formula(name)), so that one table holds both


def first_line(doc: str | None, default: str) -> str:
    return (doc or default).strip().splitlines()[0]


def rule(name: str) -> Callable[[Rule], staticmethod]:
    """Register the reference rule of primitive `name`, written right under its forward."""

    def register(fn: Rule) -> staticmethod:
        RULES[name] = fn
        return staticmethod(fn)

    return register


def formula(name: str) -> str:
    """The maths of a rule: `formula("mul")` is 'c = a·b  →  da = dc·b, db = dc·a'."""
    return first_line(RULES[name].__doc__, name) if name in RULES else name


class Primitives:
    """The primitive operations of a Tape (a mixin: `self` is the Tape recording them).

    What it needs from the Tape, declared: the backend, the node list, `_index` (a Var or a
    constant to a node index) and `_push` (append a node, return its Var)."""

    backend: Backend
    id: int
    nodes: list[Node]

    def _index(self, x: Var | Any, op: str) -> int:
        raise NotImplementedError

    def _push(self, value: Any, op: Any, inputs: tuple[int, ...], args: tuple = ()) -> Var:
        raise NotImplementedError

    def _binary(self, name: str, a: Var | Any, b: Var | Any, forward: Callable) -> Var:
        i, j = self._index(a, name), self._index(b, name)
        sa, sb = self.nodes[i].shape, self.nodes[j].shape
        try:
            np.broadcast_shapes(sa, sb)
        except ValueError:
            raise SmallemError(f"{name}: shapes {list(sa)} and {list(sb)} do not broadcast; "
                               "trailing dimensions must be equal or 1") from None
        return self._push(forward(self.nodes[i].value, self.nodes[j].value), name, (i, j))

    def _unary(self, name: str, a: Var, forward: Callable, *args: Any) -> Var:
        i = self._index(a, name)
        return self._push(forward(self.nodes[i].value, *args), name, (i,), args)

    # primitives: each forward, then its rule --------------------------------------------
    def add(self, a: Var | Any, b: Var | Any) -> Var:
        return self._binary("add", a, b, self.backend.add)

    @rule("add")
    def _add(be, grad, out, a, b):
        """c = a + b  →  da = dc, db = dc"""
        return grad, grad

    def sub(self, a: Var | Any, b: Var | Any) -> Var:
        return self._binary("sub", a, b, self.backend.sub)

    @rule("sub")
    def _sub(be, grad, out, a, b):
        """c = a − b  →  da = dc, db = −dc"""
        return grad, be.neg(grad)

    def mul(self, a: Var | Any, b: Var | Any) -> Var:
        return self._binary("mul", a, b, self.backend.mul)

    @rule("mul")
    def _mul(be, grad, out, a, b):
        """c = a·b  →  da = dc·b, db = dc·a"""
        return be.mul(grad, b), be.mul(grad, a)

    def div(self, a: Var | Any, b: Var | Any) -> Var:
        return self._binary("div", a, b, self.backend.div)

    @rule("div")
    def _div(be, grad, out, a, b):
        """c = a/b  →  da = dc/b, db = −dc·c/b"""
        da = be.div(grad, b)
        return da, be.neg(be.mul(da, out))

    def neg(self, a: Var) -> Var:
        return self._unary("neg", a, self.backend.neg)

    @rule("neg")
    def _neg(be, grad, out, a):
        """c = −a  →  da = −dc"""
        return (be.neg(grad),)

    def matmul(self, a: Var, b: Var) -> Var:
        i, j = self._index(a, "matmul"), self._index(b, "matmul")
        sa, sb = self.nodes[i].shape, self.nodes[j].shape
        if len(sa) < 2 or len(sb) < 2 or sa[-1] != sb[-2]:
            raise SmallemError(f"matmul: shapes {list(sa)} and {list(sb)} do not fit; both need "
                               "two or more dimensions and the last of the first "
                               f"({sa[-1] if sa else '-'}) must equal the second-to-last of the "
                               f"second ({sb[-2] if len(sb) > 1 else '-'})")
        try:
            np.broadcast_shapes(sa[:-2], sb[:-2])
        except ValueError:
            raise SmallemError(f"matmul: batch dimensions of {list(sa)} and {list(sb)} do not "
                               "broadcast") from None
        return self._push(self.backend.matmul(self.nodes[i].value, self.nodes[j].value),
                          "matmul", (i, j))

    @rule("matmul")
    def _matmul(be, grad, out, a, b):
        """C = A @ B  →  dA = dC @ Bᵀ, dB = Aᵀ @ dC (batch dims unbroadcast)"""
        da = be.matmul(grad, be.transpose(b, -1, -2))
        sa, sb = be.shape(a), be.shape(b)
        if len(sb) == 2 and len(sa) > 2:  # a (..., K) @ W (K, N), a Linear layer on (B, T, C):
            # every row of every batch used the same W, so dW = Σ rows aᵀ·dC as one product
            rows = be.reshape(a, (-1, sa[-1]))
            return da, be.matmul(be.transpose(rows, 0, 1), be.reshape(grad, (-1, sb[-1])))
        return da, be.matmul(be.transpose(a, -1, -2), grad)

    def transpose(self, a: Var, dim0: int = -2, dim1: int = -1) -> Var:
        for d in (dim0, dim1):
            self._check_dim("transpose", a, d)
        return self._unary("transpose", a, self.backend.transpose, dim0, dim1)

    @rule("transpose")
    def _transpose(be, grad, out, a, dim0, dim1):
        """c = aᵀ  →  da = dcᵀ (swapping two dims is undone by swapping them back)"""
        return (be.transpose(grad, dim0, dim1),)

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

    @rule("reshape")
    def _reshape(be, grad, out, a, shape):
        """c = reshape(a)  →  da = reshape(dc) to a's shape"""
        return (be.reshape(grad, be.shape(a)),)

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

    @rule("broadcast_to")
    def _broadcast_to(be, grad, out, a, shape):
        """c = broadcast(a)  →  da = dc summed over the stretched dims (unbroadcast)"""
        return (grad,)  # backward's unbroadcast does the summing

    def _check_dim(self, name: str, a: Var, dim: int | None) -> None:
        ndim = len(self.nodes[self._index(a, name)].shape)
        if dim is not None and not (isinstance(dim, (int, np.integer)) and -ndim <= dim < ndim):
            raise SmallemError(f"{name}: dimension {dim!r} is out of range for a {ndim}-dimensional input: a "
                               "dimension is one number (transpose swaps two: tape.transpose(y, 1, 2))")

    def sum(self, a: Var, dim: int | None = None, keepdim: bool = False) -> Var:
        self._check_dim("sum", a, dim)
        return self._unary("sum", a, self.backend.sum, dim, keepdim)

    @rule("sum")
    def _sum(be, grad, out, a, dim, keepdim):
        """c = Σ a  →  da = broadcast(dc): every summed element gets dc"""
        if dim is not None and not keepdim:
            grad = be.reshape(grad, _keepdim_shape(be.shape(a), dim))
        return (be.broadcast_to(grad, be.shape(a)),)

    def mean(self, a: Var, dim: int | None = None, keepdim: bool = False) -> Var:
        self._check_dim("mean", a, dim)
        return self._unary("mean", a, self.backend.mean, dim, keepdim)

    @rule("mean")
    def _mean(be, grad, out, a, dim, keepdim):
        """c = Σ a / n  →  da = broadcast(dc)/n"""
        n = int(np.prod(be.shape(a))) if dim is None else be.shape(a)[dim]
        if dim is not None and not keepdim:
            grad = be.reshape(grad, _keepdim_shape(be.shape(a), dim))
        return (be.broadcast_to(be.div(grad, float(n)), be.shape(a)),)

    def exp(self, a: Var) -> Var:
        return self._unary("exp", a, self.backend.exp)

    @rule("exp")
    def _exp(be, grad, out, a):
        """c = eᵃ  →  da = dc·c (the output, already computed)"""
        return (be.mul(grad, out),)

    def log(self, a: Var) -> Var:
        return self._unary("log", a, self.backend.log)

    @rule("log")
    def _log(be, grad, out, a):
        """c = ln a  →  da = dc/a"""
        return (be.div(grad, a),)

    def tanh(self, a: Var) -> Var:
        return self._unary("tanh", a, self.backend.tanh)

    @rule("tanh")
    def _tanh(be, grad, out, a):
        """c = tanh a  →  da = dc·(1 − c²)"""
        return (be.mul(grad, be.sub(1.0, be.square(out))),)

    def sigmoid(self, a: Var) -> Var:
        return self._unary("sigmoid", a, self.backend.sigmoid)

    @rule("sigmoid")
    def _sigmoid(be, grad, out, a):
        """c = σ(a)  →  da = dc·c·(1 − c), never more than dc/4"""
        return (be.mul(grad, be.mul(out, be.sub(1.0, out))),)

    def relu(self, a: Var) -> Var:
        return self._unary("relu", a, self.backend.relu)

    @rule("relu")
    def _relu(be, grad, out, a):
        """c = max(a, 0)  →  da = dc where a > 0, else 0 (a dead unit passes nothing)"""
        return (be.mul(grad, be.positive(a)),)

    def gelu(self, a: Var) -> Var:
        """GELU, tanh approximation (GPT-2's): ½a(1 + tanh(√(2/π)(a + 0.044715a³)))."""
        return self._unary("gelu", a, self.backend.gelu)

    @rule("gelu")
    def _gelu(be, grad, out, a):
        """c = ½a(1 + t), t = tanh u, u = √(2/π)(a + 0.044715a³)  →  da = dc·(½(1 + t) + ½a(1 − t²)u′)"""
        return (be.mul(grad, be.gelu_slope(a)),)  # the slope, computed by the backend

    def square(self, a: Var) -> Var:
        return self._unary("square", a, self.backend.square)

    @rule("square")
    def _square(be, grad, out, a):
        """c = a²  →  da = 2a·dc"""
        return (be.mul(grad, be.mul(a, 2.0)),)

    def power(self, a: Var, exponent: float) -> Var:
        if not isinstance(exponent, (int, float)) or isinstance(exponent, bool):
            raise SmallemError(f"power: the exponent must be a number (a constant), got "
                               f"{type(exponent).__name__}")
        return self._unary("power", a, self.backend.power, float(exponent))

    @rule("power")
    def _power(be, grad, out, a, exponent):
        """c = aᵖ  →  da = dc·p·aᵖ⁻¹ (p = 0: da = 0, where a = 0 too, as in PyTorch)"""
        if exponent == 0.0:  # a⁰ is constant: p·aᵖ⁻¹ would be 0·∞ = NaN at a = 0
            return (be.zeros(be.shape(a)),)
        return (be.mul(grad, be.mul(be.power(a, exponent - 1.0), exponent)),)

    def abs(self, a: Var) -> Var:
        return self._unary("abs", a, self.backend.abs)

    @rule("abs")
    def _abs(be, grad, out, a):
        """c = |a|  →  da = sign(a)·dc"""
        return (be.mul(grad, be.sign(a)),)

    def clip(self, a: Var, low: float, high: float) -> Var:
        if low > high:
            raise SmallemError(f"clip: low ({low}) is above high ({high})")
        return self._unary("clip", a, self.backend.clip, float(low), float(high))

    @rule("clip")
    def _clip(be, grad, out, a, low, high):
        """c = clip(a, lo, hi)  →  da = dc inside [lo, hi], 0 outside: learning stops there"""
        return (be.mul(grad, be.inside(a, low, high)),)

    def gather_rows(self, table: Var, rows: Any) -> Var:
        """Row lookup `table[rows]` (an embedding): rows are integers, not a Var."""
        i = self._index(table, "gather_rows")
        shape = self.nodes[i].shape
        if len(shape) != 2:
            raise SmallemError(f"gather_rows: the table must be 2-D [rows, width], got {list(shape)}")
        if not on_device(rows):  # host indices are checked here, before any upload;
            host = np.asarray(rows)  # device indices were checked before theirs (data.py)
            if host.size and (not np.issubdtype(host.dtype, np.integer) or host.min() < 0
                              or host.max() >= shape[0]):
                raise SmallemError(f"gather_rows: row indices must be integers in "
                                   f"[0, {shape[0]}); got values from {host.min()} to "
                                   f"{host.max()}")
        index = self.backend.indices(rows)
        return self._push(self.backend.gather_rows(self.nodes[i].value, index),
                          "gather_rows", (i,), (index,))

    @rule("gather_rows")
    def _gather_rows(be, grad, out, table, rows):
        """c = table[rows]  →  dtable[rows] += dc (scatter-add: repeated rows sum)"""
        return (be.scatter_add_rows(grad, rows, be.shape(table)[0]),)


def _keepdim_shape(shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    dim = dim % len(shape)
    return shape[:dim] + (1,) + shape[dim + 1:]


PRIMITIVES = tuple(RULES)  # derived, not kept by hand: every primitive has a rule

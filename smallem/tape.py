"""The tape: reverse-mode automatic differentiation over a Backend.

A Tape records every computation as a node appended to a list; a Var is the index of a node.
Nodes are appended in execution order, so `backward` walks the list in reverse with no sort,
applies one local rule per node, unbroadcasts, and accumulates into each input. Primitives and
their rules live here, each rule right under its forward; operations with rules of their own
(operations.py) go through `apply` and one shared branch of backward.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .backends import Backend, Tensor, get_backend
from .errors import SmallemError

_tape_ids = itertools.count(1)
RULES: dict[str, Callable[..., tuple]] = {}  # primitive name -> local rule


def rule(name: str) -> Callable:
    """Register the local rule of primitive `name`: (backend, grad, out, *inputs, *args) ->
    one gradient (or None) per input."""

    def register(fn: Callable) -> staticmethod:
        RULES[name] = fn
        return staticmethod(fn)

    return register


@dataclass(frozen=True, eq=False)
class Var:
    """A handle on one node of one tape: the tape and the node's index in its list."""

    tape: "Tape"
    index: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Var) and other.tape is self.tape and other.index == self.index

    def __hash__(self) -> int:
        return hash((self.tape.id, self.index))

    def __repr__(self) -> str:
        node = self.tape.nodes[self.index]
        return f"Var(tape={self.tape.id}, index={self.index}, op={node.name}, shape={node.shape})"

    @property
    def value(self) -> Tensor:
        return self.tape.nodes[self.index].value

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tape.nodes[self.index].shape

    # Operators, so that lessons can write `a * b + a`; each is a tape primitive.
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


@dataclass(eq=False)
class Node:
    value: Tensor
    op: Any  # a primitive's name (str), or an Operation object; None for leaves/constants
    inputs: tuple[int, ...]
    args: tuple = ()
    requires_grad: bool = False
    shape: tuple[int, ...] = field(default=())

    @property
    def name(self) -> str:
        if self.op is None:
            return "leaf" if self.requires_grad else "constant"
        return self.op if isinstance(self.op, str) else type(self.op).__name__


def unbroadcast(backend: Backend, grad: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum `grad` over the dimensions that broadcasting stretched, so it gets `shape`.
    A stretched value was used several times; its gradient is the sum over its copies."""
    if backend.shape(grad) == shape:  # nothing was stretched: the common case, made cheap
        return grad
    while len(backend.shape(grad)) > len(shape):  # dimensions added on the left
        grad = backend.sum(grad, 0)
    for dim, size in enumerate(shape):  # dimensions of size 1 that were stretched
        if size == 1 and backend.shape(grad)[dim] != 1:
            grad = backend.sum(grad, dim, keepdim=True)
    return grad


class Gradients:
    """The result of one backward pass: a gradient per Var of that tape. Gradients belong
    to this object, not to tensors, so there is nothing to zero between steps."""

    def __init__(self, tape: "Tape", grads: list[Tensor | None]) -> None:
        self.tape_id = tape.id
        self._grads = grads

    def get(self, var: Var) -> Tensor | None:
        if var.tape.id != self.tape_id:
            raise SmallemError(
                f"this Var belongs to tape #{var.tape.id} but these gradients come from "
                f"tape #{self.tape_id}: look gradients up with Vars of the tape you ran backward on"
            )
        return self._grads[var.index] if var.index < len(self._grads) else None

    def node(self, index: int) -> Tensor | None:
        """The gradient of node `index`, for holders of an index whose tape may already be
        gone (a Parameter's binding); the caller checks `tape_id` first."""
        return self._grads[index] if index < len(self._grads) else None

    def __getitem__(self, var: Var) -> Tensor:
        grad = self.get(var)
        if grad is None:
            raise SmallemError(
                f"node {var.index} received no gradient: it is a constant, or the loss "
                "does not depend on it"
            )
        return grad


class Tape:
    """Records a computation on `backend` and differentiates it once with `backward`."""

    PRIMITIVES = ("add", "sub", "mul", "div", "neg", "matmul", "transpose", "reshape",
                  "broadcast_to", "sum", "mean", "exp", "log", "tanh", "sigmoid", "relu",
                  "square", "abs", "clip", "gather_rows")

    def __init__(self, backend: Backend | str = "cpu64", *, use_kernels: bool = True) -> None:
        self.backend = get_backend(backend)
        self.id = next(_tape_ids)
        self.nodes: list[Node] = []
        self.closed = False  # set by backward: parameters may be updated only after that
        self.use_kernels = use_kernels  # False forces every operation's reference rule
        self.gradients: list[Tensor | None] | None = None  # kept for display after backward

    def __len__(self) -> int:
        return len(self.nodes)

    # recording ----------------------------------------------------------------------------
    def _push(self, value: Tensor, op: Any, inputs: tuple[int, ...], args: tuple = ()) -> Var:
        if self.closed:
            raise SmallemError(
                f"tape #{self.id} is closed (backward already ran on it): "
                "record a new computation on a new Tape"
            )
        requires_grad = any(self.nodes[i].requires_grad for i in inputs)
        self.nodes.append(Node(value, op, inputs, args, requires_grad, self.backend.shape(value)))
        return Var(self, len(self.nodes) - 1)

    def leaf(self, value: Any) -> Var:
        """A value whose gradient we want (a parameter, an input under test)."""
        var = self._push(self.backend.tensor(value), None, ())
        self.nodes[-1].requires_grad = True
        return var

    def constant(self, value: Any) -> Var:
        """A fixed value: it takes part in the computation but receives no gradient."""
        return self._push(self.backend.tensor(value), None, ())

    def _index(self, x: Var | Any, op: str) -> int:
        if isinstance(x, Var):
            if x.tape is not self:
                raise SmallemError(
                    f"{op}: a Var of tape #{x.tape.id} was used on tape #{self.id}; a Var is "
                    "only valid on its own tape (bind parameters with param.var(tape))"
                )
            return x.index
        return self.constant(x).index  # numbers and arrays become constants

    def value(self, x: Var) -> Tensor:
        return self.nodes[self._index(x, "value")].value

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
    def add(self, a, b) -> Var:
        return self._binary("add", a, b, self.backend.add)

    @rule("add")  # c = a + b  →  da = dc, db = dc
    def _add(B, g, out, a, b):
        return g, g

    def sub(self, a, b) -> Var:
        return self._binary("sub", a, b, self.backend.sub)

    @rule("sub")  # c = a − b  →  da = dc, db = −dc
    def _sub(B, g, out, a, b):
        return g, B.neg(g)

    def mul(self, a, b) -> Var:
        return self._binary("mul", a, b, self.backend.mul)

    @rule("mul")  # c = a·b  →  da = dc·b, db = dc·a
    def _mul(B, g, out, a, b):
        return B.mul(g, b), B.mul(g, a)

    def div(self, a, b) -> Var:
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
        if int(np.prod(old)) != int(np.prod(shape)) and -1 not in shape:
            raise SmallemError(f"reshape: cannot reshape {list(old)} ({int(np.prod(old))} "
                               f"elements) into {list(shape)} ({int(np.prod(shape))} elements)")
        return self._unary("reshape", a, self.backend.reshape, shape)

    @rule("reshape")  # the gradient takes the input's shape back
    def _reshape(B, g, out, a, shape):
        return (B.reshape(g, B.shape(a)),)

    def broadcast_to(self, a: Var, shape: Sequence[int]) -> Var:
        old = self.nodes[self._index(a, "broadcast_to")].shape
        try:
            np.broadcast_shapes(old, tuple(shape))
            assert len(shape) >= len(old)
        except (ValueError, AssertionError):
            raise SmallemError(f"broadcast_to: {list(old)} cannot be stretched to "
                               f"{list(shape)}") from None
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

    # operations: one entry point, one backward branch --------------------------------------
    def apply(self, op: Any, inputs: Sequence[Var | Any]) -> Var:
        """Run an Operation (operations.py) on `inputs` and record the operation itself."""
        idx = tuple(self._index(x, op.name) for x in inputs)
        values = [self.nodes[i].value for i in idx]
        op.check([self.nodes[i].shape for i in idx])
        kernel = self.backend.kernels.get(op.name) if self.use_kernels else None
        value = kernel.forward(self.backend, op, values) if kernel else op.forward(self.backend, values)
        return self._push(value, op, idx, (kernel,))

    # backward --------------------------------------------------------------------------------
    def accumulate(self, grads: list[Tensor | None], index: int, grad: Tensor) -> None:
        """Add a contribution to a node's gradient: never replace (a value used twice gets
        the sum of both)."""
        existing = grads[index]
        grads[index] = grad if existing is None else self.backend.add(existing, grad)

    def unbroadcast(self, grad: Tensor, shape: tuple[int, ...]) -> Tensor:
        return unbroadcast(self.backend, grad, shape)

    def backward(self, loss: Var) -> Gradients:
        """Gradients of the scalar `loss` with respect to every node that needs one."""
        i = self._index(loss, "backward")
        if self.nodes[i].shape not in ((), (1,)):
            raise SmallemError(
                f"backward: the loss must be a scalar, got shape {list(self.nodes[i].shape)}; "
                "reduce it first (tape.sum or tape.mean)"
            )
        B = self.backend
        # A backend may replace a primitive's rule by a fused kernel (same signature as RULES;
        # the GPU fuses tanh's three launches into one); use_kernels=False keeps the rules.
        fused_rules = getattr(B, "rules", {}) if self.use_kernels else {}
        grads: list[Tensor | None] = [None] * len(self.nodes)
        grads[i] = B.full(self.nodes[i].shape, 1.0)  # d loss / d loss = 1: the starting point
        for index in range(i, -1, -1):  # the list is already in order: walk it backwards
            grad = grads[index]
            node = self.nodes[index]
            if grad is None or not node.inputs or not node.requires_grad:
                continue
            values = [self.nodes[j].value for j in node.inputs]
            if isinstance(node.op, str):
                rule = fused_rules.get(node.op) or RULES[node.op]
                input_grads = rule(B, grad, node.value, *values, *node.args)
            else:
                kernel = node.args[0]
                input_grads = (kernel.backward(B, node.op, values, node.value, grad) if kernel
                               else node.op.backward(B, values, node.value, grad))
            for j, input_grad in zip(node.inputs, input_grads):
                if input_grad is not None and self.nodes[j].requires_grad:
                    self.accumulate(grads, j, self.unbroadcast(input_grad, self.nodes[j].shape))
        self.closed = True
        self.gradients = grads
        return Gradients(self, grads)

    # display -----------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """One dict per node: index, op, inputs, shape, value and gradient (after backward)."""
        out = []
        for k, node in enumerate(self.nodes):
            grad = self.gradients[k] if self.gradients is not None else None
            out.append({"index": k, "op": node.name, "inputs": list(node.inputs),
                        "shape": list(node.shape), "value": _short(self.backend, node.value),
                        "grad": "" if grad is None else _short(self.backend, grad)})
        return out

    def __repr__(self) -> str:
        lines = [f"Tape #{self.id} on {self.backend.name}, {len(self.nodes)} nodes"
                 + (" (closed)" if self.closed else "")]
        for r in self.rows():
            grad = f"  grad {r['grad']}" if r["grad"] else ""
            lines.append(f"  %{r['index']:<3} {r['op']:<12} {str(r['inputs']):<10} "
                         f"{str(r['shape']):<10} {r['value']}{grad}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("#", "op", "inputs", "shape", "value", "gradient"))
        body = "".join(
            f"<tr><td>%{r['index']}</td><td><b>{r['op']}</b></td><td>{r['inputs'] or ''}</td>"
            f"<td>{r['shape']}</td><td><code>{r['value']}</code></td>"
            f"<td><code>{r['grad']}</code></td></tr>" for r in self.rows())
        return (f"<p>Tape #{self.id} on <code>{self.backend.name}</code>, {len(self.nodes)} "
                f"nodes{' (backward done)' if self.closed else ''}</p>"
                f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def _keepdim_shape(shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    dim = dim % len(shape)
    return shape[:dim] + (1,) + shape[dim + 1:]


def _short(backend: Backend, x: Tensor, limit: int = 6) -> str:
    """A compact printout of a small tensor: up to `limit` numbers, 4 significant digits."""
    a = np.asarray(backend.to_numpy(x), dtype=np.float64)
    if a.size == 1:
        return f"{float(a.reshape(-1)[0]):.6g}"
    flat = ", ".join(f"{v:.4g}" for v in a.reshape(-1)[:limit])
    return f"[{flat}{', …' if a.size > limit else ''}]"

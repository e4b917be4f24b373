"""The tape: reverse-mode automatic differentiation over a Backend.

A Tape records every computation as a node appended to a list; a Var is the index of a node.
Nodes are appended in execution order, so `backward` walks the list in reverse with no sort,
applies one local rule per node, unbroadcasts, and accumulates into each input. The primitives
and their rules (primitives.py) are inherited; operations with rules of their own
(operations.py) go through `apply` and one shared branch of backward.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .backends import Backend, Tensor, get_backend
from .errors import SmallemError
from .primitives import RULES, Primitives  # noqa: F401  (RULES: lessons plant wrong rules there)

_tape_ids = itertools.count(1)


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


class Tape(Primitives):
    """Records a computation on `backend` and differentiates it once with `backward`."""

    def __init__(self, backend: Backend | str = "cpu64", *, use_kernels: bool = True) -> None:
        self.backend = get_backend(backend)
        self.id = next(_tape_ids)
        self.nodes: list[Node] = []
        self.closed = False  # set by backward: parameters may be updated only after that
        self.use_kernels = use_kernels  # False forces every operation's reference rule
        self.gradients: list[Tensor | None] | None = None  # kept for display after backward

    def __len__(self) -> int:
        return len(self.nodes)

    def close(self) -> None:
        """Done with this tape without differentiating it (an evaluation, a look at the
        values): it records nothing more, and the parameters it read may be updated again."""
        self.closed = True

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
        self.close()
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


def _short(backend: Backend, x: Tensor, limit: int = 6) -> str:
    """A compact printout of a small tensor: up to `limit` numbers, 4 significant digits."""
    a = np.asarray(backend.to_numpy(x), dtype=np.float64)
    if a.size == 1:
        return f"{float(a.reshape(-1)[0]):.6g}"
    flat = ", ".join(f"{v:.4g}" for v in a.reshape(-1)[:limit])
    return f"[{flat}{', …' if a.size > limit else ''}]"

"""The tape: reverse-mode automatic differentiation over a Backend.

A Tape records every computation as a node appended to a list; a Var is the index of a node
(both records are defined with the primitives that push them).
Nodes are appended in execution order, so `backward` walks the list in reverse with no sort,
applies one local rule per node (looked up in one place), unbroadcasts, and accumulates into
each input. The primitives and their rules (primitives.py) are inherited; operations with rules
of their own (operations.py) are recorded by `apply` and looked up in the same table.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..backends import DEFAULT_BACKEND, Backend, Tensor, get_backend
from ..errors import SmallemError, fmt
from .memory import MemoryReport, memory
from .nodes import Node, Var
from .primitives import RULES, Primitives, Rule, formula

_tape_ids = itertools.count(1)


def unbroadcast(be: Backend, grad: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum `grad` over the dimensions that broadcasting stretched, so it gets `shape`.
    A stretched value was used several times; its gradient is the sum over its copies."""
    if be.shape(grad) == shape:  # nothing was stretched: the common case, made cheap
        return grad
    while len(be.shape(grad)) > len(shape):  # dimensions added on the left
        grad = be.sum(grad, 0)
    for dim, size in enumerate(shape):  # dimensions of size 1 that were stretched
        if size == 1 and len(be.shape(grad)) == len(shape) and be.shape(grad)[dim] != 1:
            grad = be.sum(grad, dim, keepdim=True)
    return grad


class Gradients:
    """The result of one backward pass: a gradient per Var of that tape. Gradients belong
    to this object, not to tensors, so there is nothing to zero between steps."""

    def __init__(self, tape: Tape, grads: list[Tensor | None]) -> None:
        self.tape_id = tape.id
        self.bindings = tape.bindings  # parameter -> its leaf's index (nn.Parameter.grad)
        self._grads = grads
        self.applied = False  # set by an optimizer that updated parameters with them

    def get(self, var: Var) -> Tensor | None:
        if var.tape.id != self.tape_id:
            raise SmallemError(
                f"this Var belongs to tape #{var.tape.id} but these gradients come from "
                f"tape #{self.tape_id}: look gradients up with Vars of the tape you ran backward on"
            )
        return self._grads[var.index] if var.index < len(self._grads) else None

    def scale_parameters(self, factor: float) -> None:
        """Multiply every parameter's gradient by `factor`, in place (fp16's loss scale undone)."""
        for i in self.bindings.values():
            if self._grads[i] is not None:
                self._grads[i] = self._grads[i] * factor

    def set_node(self, index: int, grad: Tensor) -> None:
        """Replace node `index`'s gradient (a data-parallel step puts the sum over ranks there)."""
        self._grads[index] = grad

    def node(self, index: int) -> Tensor | None:
        """The gradient of node `index` (None for a constant, or a node the loss ignores)."""
        return self._grads[index] if index < len(self._grads) else None

    def __getitem__(self, var: Var) -> Tensor:
        grad = self.get(var)
        if grad is None:
            raise SmallemError(
                f"node {var.index} received no gradient: it is a constant, or the loss "
                "does not depend on it"
            )
        return grad


@dataclass(frozen=True)
class BackwardStep:
    """One step of the reverse walk: node `index` receives `grad`, its rule (`op`, `formula`)
    turns it into `contributions`, one per input (already unbroadcast; None where the input
    needs no gradient), which are added into the inputs' gradients."""

    index: int
    op: str
    formula: str
    grad: Tensor
    inputs: tuple[int, ...]
    contributions: tuple[Tensor | None, ...]
    fused: bool  # a backend's fused implementation ran instead of the reference rule


class Tape(Primitives):
    """Records a computation on `backend` and differentiates it once with `backward`.

    `rules` replaces reference rules by name on this tape only (a lesson planting a wrong rule);
    `fused=False` ignores the backend's fused implementations, so every reference rule runs;
    `precision` (fp32, tf32, bf16, fp16) is what its matrix products read (backends/precision.py)."""

    def __init__(self, backend: Backend | str = DEFAULT_BACKEND, *,
                 rules: dict[str, Rule] | None = None, fused: bool = True,
                 precision: str | None = None) -> None:
        self.backend = get_backend(backend, precision)
        self.id = next(_tape_ids)
        self.nodes: list[Node] = []
        self.rules = dict(rules or {})
        unknown = sorted(set(self.rules) - set(RULES)) if self.rules else []
        if unknown:
            raise SmallemError(f"Tape(rules=...): {unknown[0]!r} is no primitive or operation; "
                               f"choose among {', '.join(RULES)}")
        self.fused = fused
        self.bindings: dict[Any, int] = {}  # parameter -> its leaf on this tape (nn.Parameter.var)
        self.closed = False  # set by backward: parameters may be updated only after that
        self.gradients: Gradients | None = None  # kept for display after backward
        self._loss_index = -1  # the node backward started from

    def __len__(self) -> int:
        return len(self.nodes)

    def close(self) -> None:
        """Done with this tape without differentiating it (an evaluation, a look at the
        values): it records nothing more, and the parameters it read may be updated again."""
        self.closed = True

    # recording ----------------------------------------------------------------------------
    def _push(self, value: Tensor, op: str | None, inputs: tuple[int, ...], args: tuple = ()
              ) -> Var:
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

    def apply(self, op: Any, inputs: Sequence[Var | Any]) -> Var:
        """Record an Operation (operations.py) on `inputs` as one node."""
        idx = tuple(self._index(x, op.name) for x in inputs)
        values = [self.nodes[i].value for i in idx]
        op.check(*[self.nodes[i].shape for i in idx])
        forward = self.backend.fused_forward.get(op.name) if self.fused else None
        value = forward(self.backend, *values, op) if forward is not None else None
        if value is None:  # no fused forward, or it declined
            value = op.forward(self.backend, *values)
        return self._push(value, op.name, idx, (op,))

    # backward --------------------------------------------------------------------------------
    def accumulate(self, grads: list[Tensor | None], index: int, grad: Tensor) -> None:
        """Add a contribution to a node's gradient: never replace (a value used twice gets
        the sum of both)."""
        existing = grads[index]
        grads[index] = grad if existing is None else self.backend.add(existing, grad)

    def unbroadcast(self, grad: Tensor, shape: tuple[int, ...]) -> Tensor:
        return unbroadcast(self.backend, grad, shape)

    def local_gradients(self, node: Node, grad: Tensor) -> tuple[tuple, bool]:
        """Node's rule applied to `grad`: one gradient per input, as the rule returned it, and
        whether a fused implementation made them. The one place a rule is looked up: this
        tape's own, else the backend's fused one (unless it declines), else the reference."""
        be, name = self.backend, node.op
        nodes = self.nodes
        args = (grad, node.value, *[nodes[j].value for j in node.inputs], *node.args)
        planted = self.rules.get(name) if self.rules else None
        fused = be.fused.get(name) if planted is None and self.fused else None
        out = fused(be, *args) if fused is not None else None
        if out is not None:
            return out, True
        return (planted or RULES[name])(be, *args), False

    def _checked(self, name: str, k: int, grad: Tensor, shape: tuple[int, ...]) -> Tensor:
        """A rule's gradient for its input k, unbroadcast to the input's shape, or one clear
        error when it cannot be."""
        if self.backend.shape(grad) != shape:  # the common case costs one comparison
            grad = self.unbroadcast(grad, shape)
            if self.backend.shape(grad) != shape:
                raise SmallemError(
                    f"the rule of {name} returned a gradient of shape "
                    f"{list(self.backend.shape(grad))} for its input {k} of shape {list(shape)}: "
                    "a rule's gradient must have its input's shape (or one that broadcasts to it)")
        return grad

    def _repeat(self, loss: Var, grad: Any) -> Gradients | None:
        """The gradients of the backward already run on this same scalar loss (a notebook
        cell run twice), as long as no optimizer has applied them: after an update, the
        parameters no longer match the recorded activations, and this one refuses."""
        done = self.gradients
        if (done is not None and not done.applied and grad is None
                and self._index(loss, "backward") == self._loss_index):
            return done
        return None

    def _start(self, loss: Var, grad: Any) -> tuple[int, list[Tensor | None]]:
        i = self._index(loss, "backward")
        if self.closed:
            raise SmallemError(
                f"backward already ran on tape #{self.id} (or it was closed): a tape is "
                "differentiated once, since the parameters it read may have changed since; "
                "record the computation again on a new Tape")
        self._loss_index = i
        shape = self.nodes[i].shape
        grads: list[Tensor | None] = [None] * len(self.nodes)
        if grad is None:
            if shape not in ((), (1,)):
                raise SmallemError(
                    f"backward: the loss must be a scalar, got shape {list(shape)}; reduce it "
                    "first (tape.sum or tape.mean), or pass grad= with the output's shape")
            grads[i] = self.backend.full(shape, 1.0)  # d loss / d loss = 1: the starting point
        else:
            seed = self.backend.tensor(grad)
            if self.backend.shape(seed) != shape:
                raise SmallemError(f"backward: grad has shape {list(self.backend.shape(seed))} "
                                   f"but the output has shape {list(shape)}")
            grads[i] = seed
        return i, grads

    def _finish(self, grads: list[Tensor | None]) -> Gradients:
        self.close()
        self.gradients = Gradients(self, grads)
        return self.gradients

    def _walk(self, loss: Var, grad: Any, on_step: Any = None, on_final: Any = None
              ) -> Gradients:
        i, grads = self._start(loss, grad)
        nodes = self.nodes
        for index in range(i, -1, -1):  # the list is already in order: walk it backwards
            g, node = grads[index], nodes[index]
            if g is None or not node.inputs or not node.requires_grad:
                if on_final is not None and g is not None and not node.inputs:
                    on_final(index, g)  # a leaf: every node after it is done, its sum is whole
                continue
            out, used_fused = self.local_gradients(node, g)
            if len(out) != len(node.inputs):
                raise SmallemError(f"the rule of {node.op} returned {len(out)} gradients for its "
                                   f"{len(node.inputs)} inputs: a rule returns one per input")
            added: list[Tensor | None] = []
            for k, j in enumerate(node.inputs):
                contribution = out[k]
                if contribution is not None and nodes[j].requires_grad:
                    contribution = self._checked(node.op, k, contribution, nodes[j].shape)
                    self.accumulate(grads, j, contribution)
                else:
                    contribution = None
                added.append(contribution)
            if on_step is not None:  # records cost time: made only when someone reads them
                on_step(BackwardStep(index, node.op, formula(node.op), g, node.inputs,
                                     tuple(added), used_fused))
        return self._finish(grads)

    def backward(self, loss: Var, grad: Any = None, *, on_final: Any = None) -> Gradients:
        """Gradients of the scalar `loss` with respect to every node that needs one. With
        `grad` (the output's shape), the gradients of Σ grad·loss instead, for a non-scalar
        output. A tape is differentiated once: asked again for the same loss before an
        optimizer used its gradients, it gives the same ones back. `on_final(index, grad)` is
        called for each leaf as soon as its gradient is final, while the walk goes on below it
        (a data-parallel step starts summing it across ranks then: smallem/ranks/)."""
        if on_final is None:
            return self._repeat(loss, grad) or self._walk(loss, grad)
        return self._walk(loss, grad, on_final=on_final)

    def backward_steps(self, loss: Var, grad: Any = None) -> Iterator[BackwardStep]:
        """The same walk as `backward`, one record per node whose rule runs, in the order it
        runs them; afterwards `tape.gradients` holds exactly what backward returns."""
        steps: list[BackwardStep] = []
        self._walk(loss, grad, steps.append)
        return iter(steps)

    def memory(self) -> MemoryReport:
        """Bytes this tape holds: per node, per op, kept for backward, and the peak (memory.py)."""
        return memory(self)

    # display -----------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """One dict per node: index, op, inputs, shape, value and gradient (after backward)."""
        out = []
        for k, node in enumerate(self.nodes):
            grad = self.gradients.node(k) if self.gradients is not None else None
            out.append({"index": k, "op": node.name, "inputs": list(node.inputs),
                        "shape": list(node.shape), "value": fmt(self.backend.to_numpy(node.value)),
                        "grad": "" if grad is None else fmt(self.backend.to_numpy(grad))})
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
            # no empty <code> before backward: JupyterLab draws it as an empty grey box
            f"<td>{'<code>' + r['grad'] + '</code>' if r['grad'] else ''}</td></tr>"
            for r in self.rows())
        return (f"<p>Tape #{self.id} on <code>{self.backend.name}</code>, {len(self.nodes)} "
                f"nodes{' (backward done)' if self.closed else ''}</p>"
                f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

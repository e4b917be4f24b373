"""Parameters and modules: the tensors that training changes, and the layers that hold them.

Parameters live outside the tape, on a backend, and bind one leaf per tape (`param.var(tape)`)
so a parameter used twice in one computation receives the sum of its gradients. A Module shows
its parameters by name (`walk`); the optimizers and checkpoints need nothing else.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from .autodiff.operations import LAYER_NORM_EPS, layer_norm, linear, linear_add
from .autodiff.tape import Gradients, Tape, Var
from .backends import DEFAULT_BACKEND, Backend, Tensor, get_backend
from .errors import SmallemError

INIT_STD = 0.02  # small initial weights: logits near 0, so the first loss is near ln V


class Parameter:
    """A tensor that training changes in place. `decay` marks it for AdamW's weight decay
    (matrices yes; biases and embeddings no)."""

    def __init__(self, value: Any, backend: Backend | str = DEFAULT_BACKEND, decay: bool = False) -> None:
        self.backend = get_backend(backend)
        self.value: Tensor = _own(self.backend, value)
        self.decay = decay
        # Tapes that read this value and may still be open. Weak: a finished tape must be
        # free to go, and a tape that is gone cannot be hurt by an update.
        self._readers: list[weakref.ref[Tape]] = []

    @property
    def shape(self) -> tuple[int, ...]:
        return self.backend.shape(self.value)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def __repr__(self) -> str:
        return f"Parameter(shape={list(self.shape)}, decay={self.decay}, {self.backend.name})"

    def walk(self, prefix: str, visitor: Callable[[str, Parameter], None]) -> None:
        """A parameter is the simplest module: it shows itself under the name it is given."""
        visitor(prefix, self)

    def var(self, tape: Tape) -> Var:
        """This parameter's leaf on `tape`: created on the first call, the same Var after.
        The binding is the tape's (tape.bindings), so every tape finds its own leaf."""
        index = tape.bindings.get(self)
        if index is not None:
            return Var(tape, index)
        if tape.backend.name != self.backend.name:
            raise SmallemError(
                f"a parameter on backend {self.backend.name} ({self.backend.dtype}) was read "
                f"on a tape on {tape.backend.name} ({tape.backend.dtype}): build the tape on "
                f"the parameters' backend, Tape({self.backend.name!r}), or the model on the "
                "tape's")
        var = tape.leaf(self.value)  # the leaf shares the value: no copy
        tape.bindings[self] = var.index
        self._readers = [r for r in self._readers if (t := r()) is not None and not t.closed]
        self._readers.append(weakref.ref(tape))
        return var

    def grad(self, grads: Gradients) -> Tensor | None:
        """The gradient from `grads`, or None when the tape that produced them never read
        this parameter (or read it as a constant)."""
        index = grads.bindings.get(self)
        return None if index is None else grads.node(index)

    def check_writable(self, name: str = "") -> None:
        """Raise if a tape that read this value is still open: an in-place update would
        change a value that tape still holds, and its backward would silently be wrong."""
        for ref in self._readers:
            tape = ref()
            if tape is not None and not tape.closed:
                what = f"{name!r} {list(self.shape)}" if name else f"{list(self.shape)}"
                raise SmallemError(
                    f"parameter {what} is still read by tape #{tape.id}, which is open (no "
                    "backward yet): run backward on it or drop it (del the tape and its Vars, "
                    "or call tape.close()) before the optimizer updates parameters")

    def numpy(self) -> np.ndarray:
        """A host copy of the value."""
        return np.array(self.backend.to_numpy(self.value))

    def assign(self, array: Any, name: str = "") -> None:
        """Replace the value (a checkpoint being loaded); the shape must not change."""
        shape = tuple(np.shape(array))
        if shape != self.shape:
            raise SmallemError(f"parameter {name or '?'!r} has shape {list(self.shape)} but the "
                               f"value given has shape {list(shape)}")
        self.check_writable(name)
        self.value = _own(self.backend, array)


def _own(backend: Backend, data: Any) -> Tensor:
    """A tensor of its own: updated in place, it must not be the caller's array."""
    value = backend.tensor(data)
    return value.copy() if value is data else value


class Module:
    """A layer or a model. `walk` visits every Parameter and sub-Module held in an attribute
    (in the order they were assigned; lists get their index as name, None is skipped), so
    adding a layer to a model is assigning an attribute: there is no list to keep up to date.
    """

    def walk(self, prefix: str, visitor: Callable[[str, Parameter], None]) -> None:
        for name, child in vars(self).items():
            _walk_child(_join(prefix, name), child, visitor)

    def named_parameters(self) -> list[tuple[str, Parameter]]:
        named: list[tuple[str, Parameter]] = []
        self.walk("", lambda name, p: named.append((name, p)))
        return named

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def parameter_names(self) -> list[str]:
        return [name for name, _ in self.named_parameters()]

    def parameter_count(self) -> int:
        return sum(p.size for p in self.parameters())

    def summary(self) -> str:
        """One line per parameter: name, shape, count, decay; then the total."""
        rows = [f"{n:<20} {str(list(p.shape)):<12} {p.size:>9,}{'  decay' if p.decay else ''}"
                for n, p in self.named_parameters()]
        return "\n".join(rows + [f"{'total':<20} {'':<12} {self.parameter_count():>9,}"])


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _walk_child(name: str, child: Any, visitor: Callable[[str, Parameter], None]) -> None:
    if isinstance(child, (Parameter, Module)):
        child.walk(name, visitor)
    elif isinstance(child, (list, tuple)):
        for k, item in enumerate(child):
            _walk_child(_join(name, str(k)), item, visitor)


def normal(rng: np.random.Generator, shape: tuple[int, ...], std: float | None = None
           ) -> np.ndarray:
    """Initial weights N(0, INIT_STD) drawn on the host, so every backend starts from the same
    numbers."""
    return rng.normal(0.0, INIT_STD if std is None else std, size=shape)


class Embedding(Module):
    """A table of learned vectors, one row per token: weight (V, C)."""

    def __init__(self, vocab: int, dim: int, *, backend: Backend | str = DEFAULT_BACKEND,
                 rng: np.random.Generator | None = None) -> None:
        rng = rng if rng is not None else np.random.default_rng(0)
        self.weight = Parameter(normal(rng, (vocab, dim)), backend, decay=False)

    def forward(self, tape: Tape, tokens: Any) -> Var:
        """tokens (...) integers -> (..., C): row `t` of the table for token `t`."""
        return tape.gather_rows(self.weight.var(tape), tokens)

    __call__ = forward


class Linear(Module):
    """y = x·W + b with W stored (in, out), like GPT-2; x may be (B, C) or (B, T, C)."""

    def __init__(self, fan_in: int, fan_out: int, *, backend: Backend | str = DEFAULT_BACKEND,
                 rng: np.random.Generator | None = None, bias: bool = True) -> None:
        rng = rng if rng is not None else np.random.default_rng(0)
        self.weight = Parameter(normal(rng, (fan_in, fan_out)), backend, decay=True)
        self.bias = Parameter(np.zeros(fan_out), backend, decay=False) if bias else None
        # Set by built_for_speed (bench's CPU rows): the fused nodes a backend gives only on
        # request too (its `on_request`: the float32 CPU's, whose lessons count the memory of the
        # matmul and add nodes).
        self.fast = False

    def _fuses(self, tape: Tape, op: str) -> bool:
        be = tape.backend
        return op in be.fused_forward and (self.fast or op not in getattr(be, "on_request", ()))

    def forward(self, tape: Tape, x: Var, residual: Var | None = None) -> Var:
        """(..., in) -> (..., out), plus `residual` (..., out) when given. One `linear` (or
        `linear_add`) node where the backend fuses it (the GPU: the bias added in the product's
        epilogue, the residual read by the product; the float32 CPU when `fast`: one run of its
        thread team); elsewhere a matmul node and add nodes, the products and sums the lessons show
        and plant rules on."""
        w = self.weight.var(tape)
        fused = tape.fused and not tape.rules and self.bias is not None
        if fused and residual is not None and self._fuses(tape, "linear_add"):
            return linear_add(tape, x, w, self.bias.var(tape), residual)
        if self.bias is None:
            y = tape.matmul(x, w)
        elif fused and self._fuses(tape, "linear"):
            y = linear(tape, x, w, self.bias.var(tape))
        else:
            y = tape.add(tape.matmul(x, w), self.bias.var(tape))
        return y if residual is None else tape.add(residual, y)

    __call__ = forward


def built_for_speed(model: Module) -> Module:
    """`model` with every Linear in it `fast`: one fused node wherever the backend has one, the
    float32 CPU's too (backends/cpu/linear.py: the same numbers, fewer hand-overs between its
    threads). What bench's CPU rows time; a lesson's layers keep their matmul and add nodes."""
    seen: set[int] = set()  # a layer shared by two modules (or held by its own child) once

    def visit(child: Any) -> None:
        if isinstance(child, Linear):
            child.fast = True
        if isinstance(child, Module) and id(child) not in seen:
            seen.add(id(child))
            for value in vars(child).values():
                visit(value)
        elif isinstance(child, (list, tuple)):
            for item in child:
                visit(item)

    visit(model)
    return model


class LayerNorm(Module):
    """Normalise each vector over its last dimension, then scale and shift: weight (C) starts
    at 1, bias (C) at 0, neither decayed. x may be (B, C) or (B, T, C)."""

    def __init__(self, dim: int, *, backend: Backend | str = DEFAULT_BACKEND,
                 eps: float = LAYER_NORM_EPS) -> None:
        self.weight = Parameter(np.ones(dim), backend, decay=False)
        self.bias = Parameter(np.zeros(dim), backend, decay=False)
        self.eps = eps

    def forward(self, tape: Tape, x: Var) -> Var:
        """(..., C) -> (..., C), one operation on the tape (its own rule)."""
        return layer_norm(tape, x, self.weight.var(tape), self.bias.var(tape), self.eps)

    __call__ = forward

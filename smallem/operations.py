"""Operations: the second tier, computations that carry their own gradient rule.

Each operation has `forward(backend, inputs)` and, right under it, `backward(backend, inputs,
output, grad)` written with backend primitives. `tape.apply(op, vars)` stores the operation
itself, so adding one here never changes tape.py. A backend may run an operation with a fused
kernel of its own (backend.kernels); the rule written here stays the truth gradcheck tests.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

from .backends import Backend, Tensor
from .errors import SmallemError

OPERATIONS: dict[str, type] = {}  # name -> class; the registry test demands a gradcheck each


def register(cls: type) -> type:
    OPERATIONS[cls.name] = cls
    return cls


class Operation(Protocol):
    name: str

    def check(self, shapes: Sequence[tuple[int, ...]]) -> None: ...
    def forward(self, backend: Backend, inputs: Sequence[Tensor]) -> Tensor: ...
    def backward(self, backend: Backend, inputs: Sequence[Tensor], output: Tensor,
                 grad: Tensor) -> list[Tensor | None]: ...


@register
class CrossEntropy:
    """Softmax and cross-entropy fused: mean over rows of −log softmax(logits)[target].
    Inputs: logits [..., V]; targets (integers, shape [...]) belong to the operation."""

    name = "cross_entropy"

    def __init__(self, targets: Any) -> None:
        self.targets_host = np.asarray(targets.get() if hasattr(targets, "get") else targets)
        self.targets = targets
        self._device: dict[int, Tensor] = {}

    def check(self, shapes: Sequence[tuple[int, ...]]) -> None:
        (shape,) = shapes
        if tuple(shape[:-1]) != self.targets_host.shape:
            raise SmallemError(f"cross_entropy: logits {list(shape)} need targets of shape "
                               f"{list(shape[:-1])}, got {list(self.targets_host.shape)}")
        t = self.targets_host
        if t.size and (not np.issubdtype(t.dtype, np.integer) or t.min() < 0 or t.max() >= shape[-1]):
            raise SmallemError(f"cross_entropy: targets must be integers in [0, {shape[-1]})")

    def target_index(self, backend: Backend) -> Tensor:
        key = id(backend)  # move the targets to the backend's device once
        if key not in self._device:
            self._device[key] = backend.indices(self.targets)
        return self._device[key]

    def log_softmax(self, backend: Backend, logits: Tensor) -> Tensor:
        B = backend  # subtracting the row max keeps exp finite for logits of ±1e4
        shifted = B.sub(logits, B.max(logits, -1, keepdim=True))
        return B.sub(shifted, B.log(B.sum(B.exp(shifted), -1, keepdim=True)))

    def forward(self, backend: Backend, inputs: Sequence[Tensor]) -> Tensor:
        B = backend
        logp = self.log_softmax(B, inputs[0])
        picked = B.take_along_last(logp, self.target_index(B))
        return B.neg(B.mean(picked))

    # d logits = (softmax(logits) − onehot(target)) / N: what was predicted minus what should be
    def backward(self, backend: Backend, inputs: Sequence[Tensor], output: Tensor,
                 grad: Tensor) -> list[Tensor | None]:
        B = backend
        probs = B.exp(self.log_softmax(B, inputs[0]))
        n = int(np.prod(B.shape(inputs[0])[:-1]))
        diff = B.sub(probs, B.one_hot(self.target_index(B), B.shape(probs)[-1]))
        return [B.mul(diff, B.div(grad, float(n)))]


@register
class LayerNorm:
    """y = x̂·w + b with x̂ = (x − mean)/√(var + ε) over the last dimension.
    Inputs: x [..., C], weight [C], bias [C]."""

    name = "layer_norm"

    def __init__(self, eps: float = 1e-5) -> None:
        self.eps = eps

    def check(self, shapes: Sequence[tuple[int, ...]]) -> None:
        x, w, b = shapes
        if tuple(w) != (x[-1],) or tuple(b) != (x[-1],):
            raise SmallemError(f"layer_norm: input {list(x)} needs weight and bias of shape "
                               f"[{x[-1]}], got {list(w)} and {list(b)}")

    def normalize(self, backend: Backend, x: Tensor) -> tuple[Tensor, Tensor]:
        B = backend
        centered = B.sub(x, B.mean(x, -1, keepdim=True))
        scale = B.div(1.0, B.sqrt(B.add(B.mean(B.square(centered), -1, keepdim=True), self.eps)))
        return B.mul(centered, scale), scale

    def forward(self, backend: Backend, inputs: Sequence[Tensor]) -> Tensor:
        x, weight, bias = inputs
        xhat, _ = self.normalize(backend, x)
        return backend.add(backend.mul(xhat, weight), bias)

    # dx = s·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·w;  dw = Σ dy·x̂;  db = Σ dy
    def backward(self, backend: Backend, inputs: Sequence[Tensor], output: Tensor,
                 grad: Tensor) -> list[Tensor | None]:
        B = backend
        x, weight, _ = inputs
        xhat, scale = self.normalize(B, x)
        g = B.mul(grad, weight)
        mean_grad = B.mean(g, -1, keepdim=True)
        mean_projection = B.mean(B.mul(g, xhat), -1, keepdim=True)
        dx = B.mul(scale, B.sub(B.sub(g, mean_grad), B.mul(xhat, mean_projection)))
        return [dx, B.mul(grad, xhat), grad]  # the tape sums dw, db over the rows


@register
class Huber:
    """Huber loss per element: ½r² where |r| ≤ δ, else δ(|r| − δ/2), with r = prediction −
    target. Inputs: prediction, target (same shape)."""

    name = "huber"

    def __init__(self, delta: float = 1.0) -> None:
        if delta <= 0:
            raise SmallemError(f"huber: delta must be positive, got {delta}")
        self.delta = float(delta)

    def check(self, shapes: Sequence[tuple[int, ...]]) -> None:
        if tuple(shapes[0]) != tuple(shapes[1]):
            raise SmallemError(f"huber: prediction {list(shapes[0])} and target "
                               f"{list(shapes[1])} must have the same shape")

    def forward(self, backend: Backend, inputs: Sequence[Tensor]) -> Tensor:
        B = backend
        r = B.sub(inputs[0], inputs[1])
        a = B.abs(r)
        quadratic = B.mul(B.square(r), 0.5)
        linear = B.mul(B.sub(a, 0.5 * self.delta), self.delta)
        inside = B.inside(r, -self.delta, self.delta)
        return B.add(B.mul(inside, quadratic), B.mul(B.sub(1.0, inside), linear))

    # dr = clip(r, −δ, δ): the gradient keeps a constant size outside, it never vanishes
    def backward(self, backend: Backend, inputs: Sequence[Tensor], output: Tensor,
                 grad: Tensor) -> list[Tensor | None]:
        B = backend
        d = B.mul(grad, B.clip(B.sub(inputs[0], inputs[1]), -self.delta, self.delta))
        return [d, B.neg(d)]


def cross_entropy(tape: Any, logits: Any, targets: Any) -> Any:
    """Mean cross-entropy of `logits` [..., V] against integer `targets` [...]."""
    return tape.apply(CrossEntropy(targets), [logits])


def layer_norm(tape: Any, x: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Any:
    return tape.apply(LayerNorm(eps), [x, weight, bias])


def huber(tape: Any, prediction: Any, target: Any, delta: float = 1.0) -> Any:
    return tape.apply(Huber(delta), [prediction, target])

"""Operations: the second tier, computations that carry their own gradient rule.

An operation is recorded as one node (`tape.apply(op, vars)`), whatever the chain of primitives
its forward runs: fewer nodes, one fused kernel where a backend has one, better numerics. Its
rule has the primitives' contract, `backward(be, grad, out, *inputs)`, written right under its
forward, and is registered in the same RULES table, so adding an operation never changes
tape.py. The rule followed throughout: the reference rule is the truth that gradcheck tests; a
backend's fused version (`backend.fused`) matches it or declines (returns None).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backends import Backend, Tensor, on_device
from ..errors import SmallemError, require
from .primitives import RULES, Rule

LAYER_NORM_EPS = 1e-5  # added to the variance: a constant vector does not divide by 0 (PyTorch's)

OPERATIONS: dict[str, type] = {}  # name -> class; the registry test demands a gradcheck each


def _rule_of(cls: type) -> Rule:
    """An operation's rule for RULES: its node keeps the operation as its one argument, so the
    rule is that operation's backward, and its maths (formula()) is the backward's first line."""

    def operation_rule(be: Backend, grad: Tensor, out: Tensor, *inputs_then_op: Any) -> tuple:
        *inputs, op = inputs_then_op
        return op.backward(be, grad, out, *inputs)

    operation_rule.__doc__ = cls.backward.__doc__ or cls.name
    return operation_rule


def register(cls: type) -> type:
    """Make an Operation class known: its name goes in OPERATIONS and its rule in RULES."""
    OPERATIONS[cls.name] = cls
    RULES[cls.name] = _rule_of(cls)
    return cls


class Operation:
    """The contract of an operation. `check` raises a SmallemError for shapes it cannot take,
    before anything runs; `forward` computes the value; `backward` is the rule."""

    name: str = ""

    def check(self, *shapes: tuple[int, ...]) -> None:
        """Raise one clear SmallemError if the inputs' shapes do not fit."""

    def forward(self, be: Backend, *inputs: Tensor) -> Tensor:
        raise NotImplementedError

    def backward(self, be: Backend, grad: Tensor, out: Tensor, *inputs: Tensor
                 ) -> tuple[Tensor | None, ...]:
        raise NotImplementedError


@register
class CrossEntropy(Operation):
    """Softmax and cross-entropy fused: mean over rows of −log softmax(logits)[target].
    Inputs: logits [..., V]; targets (integers, shape [...]) belong to the operation."""

    name = "cross_entropy"

    def __init__(self, targets: Any) -> None:
        # Host targets are checked (check); device targets were checked before their upload.
        self.targets_host = None if on_device(targets) else np.asarray(targets)
        self.targets = targets
        self._device: dict[int, Tensor] = {}

    def check(self, *shapes: tuple[int, ...]) -> None:
        (shape,) = shapes
        target_shape = tuple(np.shape(self.targets))
        if tuple(shape[:-1]) != target_shape:
            raise SmallemError(f"cross_entropy: logits {list(shape)} need targets of shape "
                               f"{list(shape[:-1])}, got {list(target_shape)}")
        t = self.targets_host
        if t is not None and t.size and (not np.issubdtype(t.dtype, np.integer) or t.min() < 0
                                         or t.max() >= shape[-1]):
            raise SmallemError(f"cross_entropy: targets must be integers in [0, {shape[-1]})")

    def target_index(self, be: Backend) -> Tensor:
        key = id(be)  # move the targets to the backend's device once
        if key not in self._device:
            self._device[key] = be.indices(self.targets)
        return self._device[key]

    def log_softmax(self, be: Backend, logits: Tensor) -> Tensor:
        # subtracting the row max keeps exp finite for logits of ±1e4
        shifted = be.sub(logits, be.max(logits, -1, keepdim=True))
        return be.sub(shifted, be.log(be.sum(be.exp(shifted), -1, keepdim=True)))

    def forward(self, be: Backend, logits: Tensor) -> Tensor:
        picked = be.take_along_last(self.log_softmax(be, logits), self.target_index(be))
        return be.neg(be.mean(picked))

    def backward(self, be: Backend, grad: Tensor, out: Tensor, logits: Tensor) -> tuple:
        """d logits = (softmax(logits) − onehot(target))·dc/N: predicted minus true"""
        probs = be.exp(self.log_softmax(be, logits))
        n = int(np.prod(be.shape(logits)[:-1]))
        diff = be.sub(probs, be.one_hot(self.target_index(be), be.shape(probs)[-1]))
        return (be.mul(diff, be.div(grad, float(n))),)


@register
class LayerNorm(Operation):
    """y = x̂·w + b with x̂ = (x − mean)/√(var + ε) over the last dimension.
    Inputs: x [..., C], weight [C], bias [C]."""

    name = "layer_norm"

    def __init__(self, eps: float = LAYER_NORM_EPS) -> None:
        self.eps = eps

    def check(self, *shapes: tuple[int, ...]) -> None:
        x, w, b = shapes
        if not x or tuple(w) != (x[-1],) or tuple(b) != (x[-1],):
            raise SmallemError(f"layer_norm: input {list(x)} needs weight and bias of shape "
                               f"[{x[-1] if x else 'C'}], got {list(w)} and {list(b)}")

    def normalize(self, be: Backend, x: Tensor) -> tuple[Tensor, Tensor]:
        centered = be.sub(x, be.mean(x, -1, keepdim=True))
        scale = be.div(1.0, be.sqrt(be.add(be.mean(be.square(centered), -1, keepdim=True),
                                           self.eps)))
        return be.mul(centered, scale), scale

    def forward(self, be: Backend, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        xhat, _ = self.normalize(be, x)
        return be.add(be.mul(xhat, weight), bias)

    def backward(self, be: Backend, grad: Tensor, out: Tensor, x: Tensor, weight: Tensor,
                 bias: Tensor) -> tuple:
        """dx = (1/σ)·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·w;  dw = Σ dy·x̂;  db = Σ dy"""
        xhat, scale = self.normalize(be, x)
        g = be.mul(grad, weight)
        mean_grad = be.mean(g, -1, keepdim=True)
        mean_projection = be.mean(be.mul(g, xhat), -1, keepdim=True)
        dx = be.mul(scale, be.sub(be.sub(g, mean_grad), be.mul(xhat, mean_projection)))
        return dx, be.mul(grad, xhat), grad  # the tape sums dw, db over the rows


@register
class Linear(Operation):
    """y = x·W + b, a Linear layer's product and bias as one node: on the GPU one matrix product
    whose epilogue adds b, and one whose epilogue sums db (backends/cuda/linear.py). Inputs:
    x [..., K], weight [K, N], bias [N]. nn.Linear records it where a backend fuses it."""

    name = "linear"

    def check(self, *shapes: tuple[int, ...]) -> None:
        x, w, b = shapes
        if len(x) < 2 or len(w) != 2 or x[-1] != w[0] or tuple(b) != (w[1],):
            raise SmallemError(f"linear: input {list(x)} needs a weight [{x[-1] if x else 'K'}, N] "
                               f"and a bias [N], got weight {list(w)} and bias {list(b)}")

    def forward(self, be: Backend, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        return be.add(be.matmul(x, weight), bias)  # what matmul then add compute, bit for bit

    def backward(self, be: Backend, grad: Tensor, out: Tensor, x: Tensor, weight: Tensor,
                 bias: Tensor) -> tuple:
        """dx = dy·Wᵀ;  dW = Σ xᵀ·dy over the rows;  db = Σ dy over the rows"""
        dx, dw = RULES["matmul"](be, grad, None, x, weight)
        return dx, dw, grad  # the tape sums db over the rows, as it does for a bias add


@register
class LinearAdd(Operation):
    """y = r + (x·W + b): a Linear whose output joins the residual stream r, as one node: on the
    GPU one product that reads r as its C and adds b in its epilogue, so the residual add has no
    pass of its own (backends/cuda/linear.py). Inputs: x [..., K], weight [K, N], bias [N],
    r [..., N]. nn.Linear records it, given a residual, where a backend fuses it."""

    name = "linear_add"

    def check(self, *shapes: tuple[int, ...]) -> None:
        x, w, b, r = shapes
        Linear.check(self, x, w, b)
        if tuple(r) != tuple(x[:-1]) + (w[1],):
            raise SmallemError(f"linear_add: the residual must have the output's shape "
                               f"{list(x[:-1]) + [w[1]]}, got {list(r)}")

    def forward(self, be: Backend, x: Tensor, weight: Tensor, bias: Tensor, residual: Tensor) -> Tensor:
        return be.add(residual, be.add(be.matmul(x, weight), bias))  # the block's add, as it was

    def backward(self, be: Backend, grad: Tensor, out: Tensor, x: Tensor, weight: Tensor,
                 bias: Tensor, residual: Tensor) -> tuple:
        """dx = dy·Wᵀ;  dW = Σ xᵀ·dy over the rows;  db = Σ dy over the rows;  dr = dy"""
        dx, dw = RULES["matmul"](be, grad, None, x, weight)
        return dx, dw, grad, grad  # the tape sums db over the rows


_CAUSAL_MASKS: dict[tuple[str, str, int], Tensor] = {}  # (backend, dtype, T) -> (T, T) mask


@register
class Softmax(Operation):
    """s = softmax(x) over the last axis: exp(x − max) / Σ exp(x − max), the row maximum taken
    inside (exp never overflows). `causal=True` takes x (..., T, T) and gives entry (i, j > i)
    weight exactly 0: position i sees positions 0..i only (row 0 sees itself alone)."""

    name = "softmax"

    def __init__(self, causal: bool = False) -> None:
        self.causal = bool(causal)

    def check(self, *shapes: tuple[int, ...]) -> None:
        (shape,) = shapes
        if not shape or shape[-1] == 0:
            raise SmallemError(f"softmax: needs at least one entry along the last axis, got "
                               f"shape {list(shape)}")
        if self.causal and (len(shape) < 2 or shape[-1] != shape[-2]):
            raise SmallemError(f"softmax(causal=True): the last two dimensions must be equal "
                               f"(T, T): query i against key j; got shape {list(shape)}")

    def mask(self, be: Backend, size: int) -> Tensor:
        """(T, T): 0 where j ≤ i, −∞ where j > i; added to the scores, exp turns −∞ into 0."""
        # Made once per backend and size, on the first (plain) step: a captured GPU step then
        # finds it on the device and uploads nothing.
        key = (be.name, str(be.dtype), size)
        if key not in _CAUSAL_MASKS:
            _CAUSAL_MASKS[key] = be.tensor(np.triu(np.full((size, size), -np.inf), k=1))
        return _CAUSAL_MASKS[key]

    def forward(self, be: Backend, x: Tensor) -> Tensor:
        if self.causal:
            x = be.add(x, self.mask(be, be.shape(x)[-1]))
        e = be.exp(be.sub(x, be.max(x, -1, keepdim=True)))
        return be.div(e, be.sum(e, -1, keepdim=True))

    def backward(self, be: Backend, grad: Tensor, out: Tensor, x: Tensor) -> tuple:
        """dx = s ⊙ (g − Σⱼ gⱼsⱼ): a masked weight sⱼ = 0 gets gradient exactly 0"""
        return (be.mul(out, be.sub(grad, be.sum(be.mul(grad, out), -1, keepdim=True))),)


@register
class Huber(Operation):
    """Huber loss per element: ½r² where |r| ≤ δ, else δ(|r| − δ/2), with r = prediction −
    target. Inputs: prediction, target (same shape)."""

    name = "huber"

    def __init__(self, delta: float = 1.0) -> None:
        self.delta = float(require("huber's delta", delta, "positive"))

    def check(self, *shapes: tuple[int, ...]) -> None:
        if tuple(shapes[0]) != tuple(shapes[1]):
            raise SmallemError(f"huber: prediction {list(shapes[0])} and target "
                               f"{list(shapes[1])} must have the same shape")

    def forward(self, be: Backend, prediction: Tensor, target: Tensor) -> Tensor:
        r = be.sub(prediction, target)
        quadratic = be.mul(be.square(r), 0.5)
        linear = be.mul(be.sub(be.abs(r), 0.5 * self.delta), self.delta)
        inside = be.inside(r, -self.delta, self.delta)
        return be.add(be.mul(inside, quadratic), be.mul(be.sub(1.0, inside), linear))

    def backward(self, be: Backend, grad: Tensor, out: Tensor, prediction: Tensor,
                 target: Tensor) -> tuple:
        """dr = dc·clip(r, −δ, δ): the gradient keeps a constant size outside, never vanishes"""
        d = be.mul(grad, be.clip(be.sub(prediction, target), -self.delta, self.delta))
        return d, be.neg(d)


def cross_entropy(tape: Any, logits: Any, targets: Any) -> Any:
    """Mean cross-entropy of `logits` [..., V] against integer `targets` [...]."""
    return tape.apply(CrossEntropy(targets), [logits])


def layer_norm(tape: Any, x: Any, weight: Any, bias: Any, eps: float = LAYER_NORM_EPS) -> Any:
    return tape.apply(LayerNorm(eps), [x, weight, bias])


def linear(tape: Any, x: Any, weight: Any, bias: Any) -> Any:
    """x [..., K] · weight [K, N] + bias [N] as one node (its rule under Linear above)."""
    return tape.apply(Linear(), [x, weight, bias])


def linear_add(tape: Any, x: Any, weight: Any, bias: Any, residual: Any) -> Any:
    """residual + (x [..., K] · weight [K, N] + bias [N]) as one node (its rule under LinearAdd)."""
    return tape.apply(LinearAdd(), [x, weight, bias, residual])


def softmax(tape: Any, x: Any, causal: bool = False) -> Any:
    """softmax(x) over the last axis; `causal`: x (..., T, T), entries j > i get weight 0."""
    return tape.apply(Softmax(causal), [x])


def huber(tape: Any, prediction: Any, target: Any, delta: float = 1.0) -> Any:
    return tape.apply(Huber(delta), [prediction, target])

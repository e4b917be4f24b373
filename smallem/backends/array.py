"""One implementation of the Backend protocol for any NumPy-like array module.

NumPy and CuPy share an API, so every primitive is written once here against `self.xp`;
numpy.py and cupy.py only choose the module and add what must differ (`fused`, kernels).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .precision import rounder
from .protocol import Shape, Tensor, on_device

GELU_SCALE = 0.7978845608028654  # √(2/π)
GELU_CUBIC = 0.044715


class ArrayBackend:
    xp: Any  # the array module: numpy or cupy
    name: str
    dtype: Any
    def __init__(self, xp: Any, dtype: str, name: str, precision: str = "fp32") -> None:
        self.xp = xp
        self.dtype = xp.dtype(dtype)
        self.name = name
        # What the matrix products read their inputs in (precision.py); the rest stays dtype.
        self.precision = precision
        self._round = rounder(precision, self.dtype) if xp.__name__ == "numpy" else None
        # name -> a fused implementation (see protocol.Backend.fused); a subclass fills in what
        # it fuses. The reference rule stays the truth, and Tape(fused=False) ignores these.
        self.fused: dict[str, Any] = {}
        self.fused_forward: dict[str, Any] = {}

    def __repr__(self) -> str:
        lowp = f", {self.precision} matrix inputs" if self.precision != "fp32" else ""
        return f"<{type(self).__name__} {self.name} {self.dtype}{lowp}>"

    # creation and transfer -----------------------------------------------------------
    def tensor(self, data: Any) -> Tensor:
        if on_device(data) and not isinstance(data, self.xp.ndarray):
            data = data.get()  # a CuPy array arriving on the CPU backend
        a = self.xp.asarray(data, dtype=self.dtype)
        return a if a.flags.c_contiguous else self.xp.ascontiguousarray(a)

    def to_numpy(self, x: Tensor) -> Any:
        import numpy

        return numpy.asarray(x)

    def indices(self, data: Any) -> Tensor:
        a = self.xp.asarray(data, dtype=self.xp.int64)
        return a if a.flags.c_contiguous else self.xp.ascontiguousarray(a)

    def zeros(self, shape: Sequence[int]) -> Tensor:
        return self.xp.zeros(tuple(shape), dtype=self.dtype)

    def full(self, shape: Sequence[int], value: float) -> Tensor:
        return self.xp.full(tuple(shape), value, dtype=self.dtype)

    def shape(self, x: Tensor) -> Shape:
        return tuple(x.shape)

    def item(self, x: Tensor) -> float:
        return float(x)

    def synchronize(self) -> None:
        pass

    # elementwise ------------------------------------------------------------------------
    def add(self, a: Tensor, b: Tensor | float) -> Tensor:
        return a + b

    def sub(self, a: Tensor, b: Tensor | float) -> Tensor:
        return a - b

    def mul(self, a: Tensor, b: Tensor | float) -> Tensor:
        return a * b

    def div(self, a: Tensor, b: Tensor | float) -> Tensor:
        return a / b

    def neg(self, a: Tensor) -> Tensor:
        return -a

    def exp(self, a: Tensor) -> Tensor:
        return self.xp.exp(a)

    def log(self, a: Tensor) -> Tensor:
        return self.xp.log(a)

    def sqrt(self, a: Tensor) -> Tensor:
        return self.xp.sqrt(a)

    def tanh(self, a: Tensor) -> Tensor:
        return self.xp.tanh(a)

    def sigmoid(self, a: Tensor) -> Tensor:
        # 1/(1 + e⁻ᵃ) for a ≥ 0 and eᵃ/(1 + eᵃ) for a < 0: exp never overflows, and the small
        # tail keeps its relative precision (σ(−40) = 4.25e-18, where 0.5·(tanh(a/2) + 1) gives 0).
        e = self.xp.exp(-self.xp.abs(a))
        return self.xp.where(a >= 0, 1.0, e) / (1.0 + e)

    def power(self, a: Tensor, exponent: float) -> Tensor:
        return a ** exponent

    def relu(self, a: Tensor) -> Tensor:
        return self.xp.maximum(a, 0)

    def gelu(self, a: Tensor) -> Tensor:
        # The tanh approximation, GPT-2's and torch's gelu(approximate="tanh"):
        # ½a(1 + tanh(√(2/π)(a + 0.044715a³))).
        inner = a * a
        inner *= GELU_CUBIC
        inner += 1.0
        inner *= a
        inner *= GELU_SCALE
        out = self.xp.tanh(inner)
        out += 1.0
        out *= a
        out *= 0.5
        return out

    def gelu_slope(self, a: Tensor) -> Tensor:
        # d gelu/da = ½(1 + t) + ½a(1 − t²)·√(2/π)(1 + 3·0.044715a²), t = tanh(u): in place,
        # a few passes over memory instead of a dozen temporaries.
        a2 = a * a
        t = a2 * GELU_CUBIC
        t += 1.0
        t *= a
        t *= GELU_SCALE
        t = self.xp.tanh(t, out=t)
        du = a2  # reuse: u′ = √(2/π)(1 + 3·0.044715a²)
        du *= 3.0 * GELU_CUBIC
        du += 1.0
        du *= GELU_SCALE
        du *= a
        du *= 0.5  # ½a·u′
        out = t * t
        out -= 1.0
        out *= du  # −½a·u′(1 − t²)
        t += 1.0
        t *= 0.5
        t -= out
        return t

    def square(self, a: Tensor) -> Tensor:
        return a * a

    def abs(self, a: Tensor) -> Tensor:
        return self.xp.abs(a)

    def sign(self, a: Tensor) -> Tensor:
        return self.xp.sign(a)

    def clip(self, a: Tensor, low: float, high: float) -> Tensor:
        return self.xp.clip(a, low, high)

    def positive(self, a: Tensor) -> Tensor:
        return (a > 0).astype(self.dtype)

    def inside(self, a: Tensor, low: float, high: float) -> Tensor:
        return ((a >= low) & (a <= high)).astype(self.dtype)

    # shape and reductions ---------------------------------------------------------------
    def matmul(self, a: Tensor, b: Tensor | float) -> Tensor:
        if self._round is not None:  # a lower precision, emulated: inputs rounded, sums in dtype
            a, b = self._round(a), self._round(b)
        return self._matmul(a, b)

    def _matmul(self, a: Tensor, b: Tensor) -> Tensor:
        if getattr(b, "ndim", 0) == 2 and a.ndim > 2:
            # (..., K) @ (K, N) as one (rows, K) @ (K, N) product: one large GEMM instead of
            # one per leading index (a Linear layer on (B, T, C)); a strided `a` is copied
            # first, which costs far less than NumPy's loop over strided slices.
            rows = a if a.flags.c_contiguous else self.xp.ascontiguousarray(a)
            flat = self._matmul(rows.reshape(-1, a.shape[-1]), b)
            return flat.reshape(a.shape[:-1] + (b.shape[-1],))
        return a @ b

    def transpose(self, a: Tensor, dim0: int, dim1: int) -> Tensor:
        return self.xp.swapaxes(a, dim0, dim1)

    def reshape(self, a: Tensor, shape: Sequence[int]) -> Tensor:
        return a.reshape(tuple(shape))

    def broadcast_to(self, a: Tensor, shape: Sequence[int]) -> Tensor:
        return self.xp.broadcast_to(a, tuple(shape))

    def sum(self, a: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
        return self.xp.sum(a, axis=dim, keepdims=keepdim)

    def mean(self, a: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
        return self.xp.mean(a, axis=dim, keepdims=keepdim)

    def max(self, a: Tensor, dim: int | None, keepdim: bool = False) -> Tensor:
        return self.xp.max(a, axis=dim, keepdims=keepdim)

    # indexing ---------------------------------------------------------------------------
    def gather_rows(self, table: Tensor, rows: Tensor) -> Tensor:
        return table[rows]

    def scatter_add_rows(self, values: Tensor, rows: Tensor, num_rows: int) -> Tensor:
        # out[rows[i]] += values[i]; a row index may repeat, and every repeat must count.
        out = self.xp.zeros((num_rows,) + tuple(values.shape[rows.ndim:]), dtype=values.dtype)
        flat = values.reshape((-1,) + tuple(values.shape[rows.ndim:]))
        self.xp.add.at(out, rows.reshape(-1), flat)
        return out

    def take_along_last(self, a: Tensor, index: Tensor) -> Tensor:
        return self.xp.take_along_axis(a, index[..., None], axis=-1)[..., 0]

    def one_hot(self, index: Tensor, classes: int) -> Tensor:
        # A comparison against 0..classes-1: the same code for NumPy and CuPy.
        return (index[..., None] == self.xp.arange(classes)).astype(self.dtype)

    # optimizer updates, every parameter in place ------------------------------------------
    def sgd_update(self, params: Sequence[Tensor], grads: Sequence[Tensor], *, lr: float
                   ) -> None:
        for p, g in zip(params, grads):
            p -= lr * g

    def adamw_update(self, params: Sequence[Tensor], grads: Sequence[Tensor],
                     ms: Sequence[Tensor], vs: Sequence[Tensor], *, steps: Sequence[int],
                     lr: float, beta1: float, beta2: float, eps: float,
                     weight_decays: Sequence[float]) -> None:
        # m = β1·m + (1−β1)·g ; v = β2·v + (1−β2)·g² ; p −= lr·(m̂/(√v̂+ε) + wd·p),
        # written as p ← p·(1 − lr·wd) − (lr/bc1)·m/(√(v/bc2) + ε): the same numbers
        # with fewer passes over memory, which is what the CPU's time goes to.
        for p, g, m, v, t, wd in zip(params, grads, ms, vs, steps, weight_decays):
            m *= beta1
            m += (1.0 - beta1) * g
            v *= beta2
            v += (1.0 - beta2) * (g * g)
            denom = self.xp.sqrt(v / (1.0 - beta2 ** t))
            denom += eps
            if wd:
                p *= 1.0 - lr * wd  # decoupled decay reads the old p: do it first
            step = m * (lr / (1.0 - beta1 ** t))
            step /= denom
            p -= step

"""Elementwise kernels of the GPU backend: one RawKernel per primitive, and the fused tanh and
bias-add rules.

y = f(a) and c = a ∘ b, where b is a trailing block of a's shape (same shape, a bias row, a
scalar array): b's index is i % nb. Scalars come as a float argument. cupy.py's `_unary` and
`_binary` launch `unary_<name>` and `binary_<name>[_scalar_a|_scalar_b]`.
"""

from __future__ import annotations

from typing import Any

from .common import F32, HEADER, _empty, fast, kernel, launch
from .reductions import column_sums

UNARY = {"neg": "-a", "exp": "expf(a)", "log": "logf(a)", "sqrt": "sqrtf(a)",
         "tanh": "tanhf(a)", "square": "a * a", "abs": "fabsf(a)",
         "relu": "a < 0.f ? 0.f : a",  # NaN passes through, as with NumPy's maximum
         # 1/(1 + e⁻ᵃ) or eᵃ/(1 + eᵃ): the small tail keeps its relative precision
         "sigmoid": "a >= 0.f ? 1.f / (1.f + expf(-a)) : expf(a) / (1.f + expf(a))"}
BINARY = {"add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b"}

SOURCE = HEADER + "".join(
    f"""
extern "C" __global__ void unary_{name}(const float* x, float* y, long long n) {{
    GRID_STRIDE(i, n) {{ float a = x[i]; y[i] = {expr}; }}
}}""" for name, expr in UNARY.items()) + "".join(
    f"""
extern "C" __global__ void binary_{name}(const float* x, const float* z, float* y,
                                         long long n, long long nz) {{
    GRID_STRIDE(i, n) {{ float a = x[i], b = z[i % nz]; y[i] = {expr}; }}
}}
extern "C" __global__ void binary_{name}_scalar_b(const float* x, float b, float* y, long long n) {{
    GRID_STRIDE(i, n) {{ float a = x[i]; y[i] = {expr}; }}
}}
extern "C" __global__ void binary_{name}_scalar_a(float a, const float* z, float* y, long long n) {{
    GRID_STRIDE(i, n) {{ float b = z[i]; y[i] = {expr}; }}
}}""" for name, expr in BINARY.items()) + r"""
// tanh's rule, da = dc·(1 − c²), in one launch where the rule's primitives take three.
extern "C" __global__ void tanh_backward(const float* g, const float* c, float* out, long long n) {
    GRID_STRIDE(i, n) { float t = c[i]; out[i] = g[i] * (1.f - t * t); }
}

extern "C" __global__ void fill(float* y, float value, long long n) {
    GRID_STRIDE(i, n) y[i] = value;
}
"""


def elementwise(name: str) -> Any:
    """The kernel `name` of this file (`unary_exp`, `binary_add_scalar_b`, `fill`, ...)."""
    return kernel(SOURCE, name)


def tanh_rule(be: Any, grad: Any, out: Any, a: Any) -> tuple | None:
    """fused["tanh"]: primitives' tanh rule, da = dc·(1 − c²), as one launch instead of three."""
    if not (fast(grad) and fast(out) and grad.shape == out.shape):
        return None
    da = _empty(out.shape, F32)
    launch(kernel(SOURCE, "tanh_backward"), out.size, (grad, out, da, out.size))
    return (da,)


def add_rule(be: Any, grad: Any, out: Any, a: Any, b: Any) -> tuple | None:
    """fused["add"] for x + bias (a bias row, positions (T, C)): da = dc, and db = dc summed
    over every leading row at once (the reference sums one leading dimension at a time).
    Anything else declines: same shapes need no sum at all."""
    if not (fast(grad) and fast(b) and type(a) is _empty and a.shape == grad.shape
            and 0 < b.ndim < grad.ndim and b.shape == grad.shape[grad.ndim - b.ndim:]
            and b.size):
        return None
    db = _empty(b.shape, F32)
    column_sums(grad, db, grad.size // b.size, b.size)
    return grad, db

"""Elementwise kernels of the GPU backend: one RawKernel per primitive, and the fused tanh and
bias-add rules.

y = f(a) and c = a ∘ b, where b is a trailing block of a's shape (same shape, a bias row, a
scalar array): b's index is i % nb. Scalars come as a float argument. cupy.py's `_unary` and
`_binary` launch `unary_<name>` and `binary_<name>[_scalar_a|_scalar_b]`. In bf16 or fp16 an add
of two arrays of one shape (a residual, two gradients accumulated: the gradient a Linear's
backward reads) writes its 16-bit copy too, and so does `swap_middle` (the heads merged).
"""

from __future__ import annotations

from typing import Any

from . import halves
from .common import F32, HEADER, _empty, fast, kernel, launch, launch4, vectored
from .reductions import column_sums

UNARY = {"neg": "-a", "exp": "expf(a)", "log": "logf(a)", "sqrt": "sqrtf(a)",
         "tanh": "tanhf(a)", "square": "a * a", "abs": "fabsf(a)",
         "relu": "a < 0.f ? 0.f : a",  # NaN passes through, as with NumPy's maximum
         # 1/(1 + e⁻ᵃ) or eᵃ/(1 + eᵃ): the small tail keeps its relative precision
         "sigmoid": "a >= 0.f ? 1.f / (1.f + expf(-a)) : expf(a) / (1.f + expf(a))"}
BINARY = {"add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b"}

SOURCE = HEADER + halves.HALF + halves.HALF4 + "".join(
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

// a + b of one shape, and its 16-bit copy.
extern "C" __global__ void binary_add_half(const float* x, const float* z, float* y, long long n,
                                           unsigned short* h, int fp16) {
    GRID_STRIDE(i, n) { float v = x[i] + z[i]; y[i] = v; put_half(h, i, v, fp16); }
}

// The same, four floats a thread (n4 = n / 4).
extern "C" __global__ void binary_add_half4(const float4* x, const float4* z, float4* y,
                                            long long n4, unsigned short* h, int fp16) {
    GRID_STRIDE(i, n4) {
        float4 a = x[i], b = z[i], v;
        v.x = a.x + b.x; v.y = a.y + b.y; v.z = a.z + b.z; v.w = a.w + b.w;
        y[i] = v;
        put_half4(h, i, v, fp16);
    }
}

// y (A, B, C, D) = x (A, C, B, D) with its middle dimensions swapped, row-major both: the heads
// merged back, (B, H, T, D) -> (B, T, H, D), forward (attention's output) and backward (dq, dk,
// dv); with the 16-bit copy the next product reads when h is not null.
extern "C" __global__ void swap_middle(const float* x, float* y, long long n, long long b,
                                       long long c, long long d, unsigned short* h, int fp16) {
    GRID_STRIDE(i, n) {
        long long k = i % d, j = (i / d) % c, m = (i / (d * c)) % b, a = i / (d * c * b);
        float v = x[((a * c + j) * b + m) * d + k];
        y[i] = v;
        put_half(h, i, v, fp16);
    }
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


def add_with_copy(a: Any, b: Any, precision: str) -> Any:
    """a + b (contiguous float32, one shape) and its 16-bit copy (halves.py), one launch."""
    out = _empty(a.shape, F32)
    tail = (halves.output_copy(out, precision), halves.fp16_flag(precision))
    if vectored(a, b, out):  # four a thread (common.VECTORS)
        launch4(elementwise("binary_add_half4"), a.size, (a, b, out, a.size // 4, *tail))
    else:
        launch(elementwise("binary_add_half"), a.size, (a, b, out, a.size, *tail))
    return out


def swap_middle(a: Any, precision: str) -> Any | None:
    """A row-major copy of a 4-D float32 view whose two middle dimensions are swapped from a
    row-major array (a transpose(1, 2) of one: the heads being merged), in one launch, with its
    16-bit copy in bf16/fp16. None for any other layout."""
    if not (type(a) is _empty and a.dtype == F32 and a.ndim == 4 and a.size
            and a.swapaxes(1, 2)._c_contiguous):
        return None
    out = _empty(a.shape, F32)
    _, b, c, d = a.shape
    launch(elementwise("swap_middle"), a.size, (a.swapaxes(1, 2), out, a.size, b, c, d,
                                                 halves.output_copy(out, precision),
                                                 halves.fp16_flag(precision)))
    return out

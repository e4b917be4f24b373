"""The Transformer's fused kernels on the GPU backend: softmax (causal or not), LayerNorm, GELU.

Each is one RawKernel launch (two for LayerNorm's rule) where the reference rule runs five to
fifteen primitives. Each is registered in cupy.py's `fused` / `fused_forward` tables under the
plain name, matches the reference rule (tests/test_gpu.py compares them) or declines (None).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import cupy
import numpy as np

from . import cupy_kernels as K

F32 = np.dtype(np.float32)
_empty = cupy.ndarray
GELU_K = 0.7978845608028654  # √(2/π)
GELU_A = 0.044715

SOURCE = K.HEADER + r"""
// One warp per row of n scores. Causal: row r is query i = r % n of its (n, n) block and sees
// keys j <= i only; the others get exactly 0, in the forward and in the rule.
extern "C" __global__ void softmax_forward(const float* x, float* y, long long rows, int n,
                                           int causal) {
    long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float* xr = x + r * n;
    float* yr = y + r * n;
    int limit = causal ? (int)(r % n) + 1 : n;
    float m = NEG_INF;
    for (int j = lane; j < limit; j += 32) m = fmaxf(m, xr[j]);
    m = warp_max(m);
    float s = 0.f;
    for (int j = lane; j < limit; j += 32) s += expf(xr[j] - m);
    float inv = 1.f / warp_sum(s);
    for (int j = lane; j < n; j += 32) yr[j] = j < limit ? expf(xr[j] - m) * inv : 0.f;
}

// dx = y ⊙ (g − Σⱼ gⱼ yⱼ), one warp per row; a masked y is 0, so is its dx.
extern "C" __global__ void softmax_backward(const float* g, const float* y, float* dx,
                                            long long rows, int n) {
    long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float* gr = g + r * n;
    const float* yr = y + r * n;
    float dot = 0.f;
    for (int j = lane; j < n; j += 32) dot += gr[j] * yr[j];
    dot = warp_sum(dot);
    for (int j = lane; j < n; j += 32) dx[r * n + j] = yr[j] * (gr[j] - dot);
}

// One warp per row of c features: mean, then the variance of the centered values (as the
// reference computes them), then rstd = 1/√(var + ε).
__device__ __forceinline__ void row_stats(const float* xr, int c, int lane, float eps,
                                          float* mean, float* rstd) {
    float s = 0.f;
    for (int j = lane; j < c; j += 32) s += xr[j];
    float mu = warp_sum(s) / c;
    float v = 0.f;
    for (int j = lane; j < c; j += 32) { float d = xr[j] - mu; v += d * d; }
    *mean = mu;
    *rstd = 1.f / sqrtf(warp_sum(v) / c + eps);
}

extern "C" __global__ void layer_norm_forward(const float* x, const float* w, const float* b,
                                              float* y, long long rows, int c, float eps) {
    long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float* xr = x + r * c;
    float mu, rstd;
    row_stats(xr, c, lane, eps, &mu, &rstd);
    for (int j = lane; j < c; j += 32) y[r * c + j] = (xr[j] - mu) * rstd * w[j] + b[j];
}

// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·w; and, side by side in `parts`
// (rows, 2c), dy·x̂ and dy, whose column sums (one column_sum launch) are dw and db.
extern "C" __global__ void layer_norm_backward(const float* dy, const float* x, const float* w,
                                               float* dx, float* parts, long long rows, int c,
                                               float eps) {
    long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float* xr = x + r * c;
    const float* dyr = dy + r * c;
    float mu, rstd;
    row_stats(xr, c, lane, eps, &mu, &rstd);
    float sg = 0.f, sgx = 0.f;
    for (int j = lane; j < c; j += 32) {
        float xh = (xr[j] - mu) * rstd, g = dyr[j] * w[j];
        sg += g;
        sgx += g * xh;
        parts[r * 2 * c + j] = dyr[j] * xh;
        parts[r * 2 * c + c + j] = dyr[j];
    }
    float mg = warp_sum(sg) / c, mgx = warp_sum(sgx) / c;
    for (int j = lane; j < c; j += 32) {
        float xh = (xr[j] - mu) * rstd;
        dx[r * c + j] = rstd * (dyr[j] * w[j] - mg - xh * mgx);
    }
}

// GELU, tanh form: y = ½x(1 + tanh(k(x + a·x³))); its rule in one launch.
extern "C" __global__ void gelu_forward(const float* x, float* y, long long n, float k, float a) {
    GRID_STRIDE(i, n) { float v = x[i]; y[i] = 0.5f * v * (1.f + tanhf(k * (v + a * v * v * v))); }
}

extern "C" __global__ void gelu_backward(const float* g, const float* x, float* dx, long long n,
                                         float k, float a) {
    GRID_STRIDE(i, n) {
        float v = x[i], t = tanhf(k * (v + a * v * v * v));
        dx[i] = g[i] * (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * k * (1.f + 3.f * a * v * v));
    }
}
"""


@cache
def _module() -> Any:
    return cupy.RawModule(code=SOURCE)


@cache
def function(name: str) -> Any:
    """A kernel of SOURCE by name (compiled on first use, cached on disk by CuPy)."""
    return _module().get_function(name)


def _fast(a: Any) -> bool:
    return type(a) is cupy.ndarray and a.dtype == F32 and a._c_contiguous


def _warps(rows: int) -> tuple[tuple[int], tuple[int]]:
    """A warp per row, K.BLOCK threads a block."""
    per_block = K.BLOCK // 32
    return ((rows + per_block - 1) // per_block,), (K.BLOCK,)


def _causal(op: Any) -> bool:
    return bool(getattr(op, "causal", False))


def softmax_forward(be: Any, x: Any, op: Any) -> Any:
    """fused_forward["softmax"]: the softmax over the last dimension, the causal mask inside
    (a causal input must end in a square (T, T) block)."""
    if not (_fast(x) and x.ndim >= 1 and x.size) or getattr(op, "dim", -1) not in (-1, x.ndim - 1):
        return None
    n = x.shape[-1]
    if _causal(op) and (x.ndim < 2 or x.shape[-2] != n):
        return None
    rows = x.size // n
    y = _empty(x.shape, F32)
    function("softmax_forward")(*_warps(rows), (x, y, rows, np.int32(n), np.int32(_causal(op))))
    return y


def softmax_rule(be: Any, grad: Any, out: Any, x: Any, op: Any) -> tuple | None:
    """fused["softmax"]: dx = s ⊙ (g − Σ g·s) from the forward's output s, one warp per row."""
    if not (_fast(grad) and _fast(out) and grad.shape == out.shape and out.size):
        return None
    n = out.shape[-1]
    rows = out.size // n
    dx = _empty(out.shape, F32)
    function("softmax_backward")(*_warps(rows), (grad, out, dx, rows, np.int32(n)))
    return (dx,)


def _layer_norm_fits(x: Any, w: Any, b: Any) -> bool:
    return (_fast(x) and _fast(w) and _fast(b) and x.ndim >= 1 and x.size
            and w.shape == b.shape == (x.shape[-1],))


def layer_norm_forward(be: Any, x: Any, w: Any, b: Any, op: Any) -> Any:
    """fused_forward["layer_norm"]: y = x̂·w + b, one warp per row."""
    if not _layer_norm_fits(x, w, b):
        return None
    c = x.shape[-1]
    rows = x.size // c
    y = _empty(x.shape, F32)
    function("layer_norm_forward")(*_warps(rows), (x, w, b, y, rows, np.int32(c),
                                                   np.float32(op.eps)))
    return y


def layer_norm_rule(be: Any, grad: Any, out: Any, x: Any, w: Any, b: Any, op: Any
                    ) -> tuple | None:
    """fused["layer_norm"]: dx in one launch (x̂ recomputed from x), dw and db as one
    column sum of the (dy·x̂, dy) pairs it writes (two launches over many rows): already
    summed over the rows."""
    if not (_layer_norm_fits(x, w, b) and _fast(grad) and grad.shape == x.shape):
        return None
    c = x.shape[-1]
    rows = x.size // c
    dx = _empty(x.shape, F32)
    parts = _empty((rows, 2 * c), F32)
    function("layer_norm_backward")(*_warps(rows), (grad, x, w, dx, parts, rows, np.int32(c),
                                                    np.float32(op.eps)))
    sums = _empty((2 * c,), F32)
    K.column_sums(parts, sums, rows, 2 * c)
    return dx, sums[:c], sums[c:]


def gelu(x: Any) -> Any | None:
    """The backend's gelu on a contiguous float32 array, one launch (None: not ours to take)."""
    if not _fast(x):
        return None
    y = _empty(x.shape, F32)
    K.launch(function("gelu_forward"), x.size, (x, y, x.size, np.float32(GELU_K),
                                                 np.float32(GELU_A)))
    return y


def gelu_rule(be: Any, grad: Any, out: Any, x: Any, *op: Any) -> tuple | None:
    """fused["gelu"]: da = dc·(½(1 + t) + ½x(1 − t²)·k(1 + 3a·x²)), t = tanh(k(x + a·x³))."""
    if not (_fast(grad) and _fast(x) and grad.shape == x.shape):
        return None
    dx = _empty(x.shape, F32)
    K.launch(function("gelu_backward"), x.size, (grad, x, dx, x.size, np.float32(GELU_K),
                                                  np.float32(GELU_A)))
    return (dx,)


FUSED = {"softmax": softmax_rule, "layer_norm": layer_norm_rule, "gelu": gelu_rule}
FUSED_FORWARD = {"softmax": softmax_forward, "layer_norm": layer_norm_forward}

"""The softmax over the last dimension on the GPU, causal or not: its forward and its rule, one
launch each (a warp per row) where the reference runs five to fifteen primitives.

operations.Softmax's forward and rule stay the truth; tests/gpu/test_fused_operations.py
compares them. A causal input must end in a square (T, T) block; anything else declines (None)
and the reference runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .common import F32, HEADER, _empty, fast, kernel, warps

SOURCE = HEADER + r"""
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

"""


def _causal(op: Any) -> bool:
    return bool(getattr(op, "causal", False))


def softmax_forward(be: Any, x: Any, op: Any) -> Any:
    """fused_forward["softmax"]: the softmax over the last dimension, the causal mask inside
    (a causal input must end in a square (T, T) block)."""
    if not (fast(x) and x.ndim >= 1 and x.size) or getattr(op, "dim", -1) not in (-1, x.ndim - 1):
        return None
    n = x.shape[-1]
    if _causal(op) and (x.ndim < 2 or x.shape[-2] != n):
        return None
    rows = x.size // n
    y = _empty(x.shape, F32)
    kernel(SOURCE, "softmax_forward")(*warps(rows), (x, y, rows, np.int32(n),
                                                      np.int32(_causal(op))))
    return y


def softmax_rule(be: Any, grad: Any, out: Any, x: Any, op: Any) -> tuple | None:
    """fused["softmax"]: dx = s ⊙ (g − Σ g·s) from the forward's output s, one warp per row."""
    if not (fast(grad) and fast(out) and grad.shape == out.shape and out.size):
        return None
    n = out.shape[-1]
    rows = out.size // n
    dx = _empty(out.shape, F32)
    kernel(SOURCE, "softmax_backward")(*warps(rows), (grad, out, dx, rows, np.int32(n)))
    return (dx,)

"""LayerNorm on the GPU: its forward in one launch (a warp per row, the row read once in float4s
where common.VECTORS and the width allow), its rule in two (dx with each warp's sums of dy·x̂
and dy over the rows it took, then dw and db as one column sum of them).

operations.LayerNorm's forward and rule stay the truth; tests/gpu/test_fused_operations.py
compares them. In bf16 or fp16 the forward writes y's 16-bit copy (the products after it read
it: halves.py), and the rule dx's (the Linear before it reads dx as its output's gradient).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import halves
from .common import F32, HEADER, _empty, fast, kernel, vectored, warps
from .reductions import column_sums

SOURCE = HEADER + halves.HALF + halves.HALF4 + r"""
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
                                              float* y, long long rows, int c, float eps,
                                              unsigned short* h, int fp16) {
    long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float* xr = x + r * c;
    float mu, rstd;
    row_stats(xr, c, lane, eps, &mu, &rstd);
    for (int j = lane; j < c; j += 32) {
        float v = (xr[j] - mu) * rstd * w[j] + b[j];
        y[r * c + j] = v;
        put_half(h, r * c + j, v, fp16);
    }
}

// The same for c a multiple of 4 up to 1,024 (c4 = c / 4 float4s): the row read once into
// registers (8 float4s a lane at most), sums over 4 neighbours a lane (another order than the
// kernel above: the same values to float32 rounding, not the same bits), 128-bit loads and stores.
extern "C" __global__ void layer_norm_forward4(const float4* x, const float4* w, const float4* b,
                                               float4* y, long long rows, int c4, float eps,
                                               unsigned short* h, int fp16) {
    long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float4* xr = x + r * c4;
    float4 v[8];
    float s = 0.f, var = 0.f, c = 4.f * c4;
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (lane + 32 * k < c4) { v[k] = xr[lane + 32 * k]; s += (v[k].x + v[k].y) + (v[k].z + v[k].w); }
    float mu = warp_sum(s) / c;
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (lane + 32 * k < c4) {
            float a = v[k].x - mu, bb = v[k].y - mu, cc = v[k].z - mu, d = v[k].w - mu;
            var += (a * a + bb * bb) + (cc * cc + d * d);
        }
    float rstd = 1.f / sqrtf(warp_sum(var) / c + eps);
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (lane + 32 * k < c4) {
            int j = lane + 32 * k;
            float4 ww = w[j], bw = b[j], o;
            o.x = (v[k].x - mu) * rstd * ww.x + bw.x; o.y = (v[k].y - mu) * rstd * ww.y + bw.y;
            o.z = (v[k].z - mu) * rstd * ww.z + bw.z; o.w = (v[k].w - mu) * rstd * ww.w + bw.w;
            y[r * c4 + j] = o;
            put_half4(h, r * c4 + j, o, fp16);
        }
}

// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·w; and, side by side in `parts`
// (rows, 2c), dy·x̂ and dy, whose column sums (one column_sum launch) are dw and db.
extern "C" __global__ void layer_norm_backward(const float* dy, const float* x, const float* w,
                                               float* dx, float* parts, long long rows, int c,
                                               float eps, unsigned short* h, int fp16) {
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
        float d = rstd * (dyr[j] * w[j] - mg - xh * mgx);
        dx[r * c + j] = d;
        put_half(h, r * c + j, d, fp16);
    }
}

// The rule for c ≤ 32·LN_COLS: a warp takes rows w, w + W, w + 2W, ... (W warps in all), writes
// their dx as layer_norm_backward does (the same sums in the same order: the same dx), and keeps
// its own sums of dy·x̂ and dy per column in registers, written once to partial[w] (W, 2c) at the
// end: W rows of sums for the column sum to add instead of one per row of x (2c floats a row
// written and read again: about half of the rule's traffic). A row of x and dy is read once into
// registers, all its loads in flight together (116 registers: 16 warps an SM, not 64).
#define LN_COLS 16
extern "C" __global__ void layer_norm_backward_sums(
        const float* dy, const float* x, const float* w, float* dx, float* partial, long long rows,
        int c, float eps, unsigned short* h, int fp16) {
    long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    long long warps_all = ((long long)gridDim.x * blockDim.x) >> 5;
    int lane = threadIdx.x & 31;
    float sw[LN_COLS], sb[LN_COLS], xv[LN_COLS], dv[LN_COLS];
#pragma unroll
    for (int i = 0; i < LN_COLS; ++i) { sw[i] = 0.f; sb[i] = 0.f; }
    for (long long r = warp; r < rows; r += warps_all) {
        const float* xr = x + r * c;
        const float* dyr = dy + r * c;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < LN_COLS; ++i) {
            int j = lane + 32 * i;
            xv[i] = j < c ? xr[j] : 0.f;
            dv[i] = j < c ? dyr[j] : 0.f;
        }
#pragma unroll
        for (int i = 0; i < LN_COLS; ++i)
            if (lane + 32 * i < c) s += xv[i];
        float mu = warp_sum(s) / c, v = 0.f;  // row_stats' sums, in its order
#pragma unroll
        for (int i = 0; i < LN_COLS; ++i)
            if (lane + 32 * i < c) { float d = xv[i] - mu; v += d * d; }
        float rstd = 1.f / sqrtf(warp_sum(v) / c + eps);
        float sg = 0.f, sgx = 0.f;
#pragma unroll
        for (int i = 0; i < LN_COLS; ++i) {
            if (lane + 32 * i < c) {
                float xh = (xv[i] - mu) * rstd, g = dv[i] * w[lane + 32 * i];
                sg += g;
                sgx += g * xh;
                sw[i] += dv[i] * xh;
                sb[i] += dv[i];
            }
        }
        float mg = warp_sum(sg) / c, mgx = warp_sum(sgx) / c;
#pragma unroll
        for (int i = 0; i < LN_COLS; ++i) {
            int j = lane + 32 * i;
            if (j < c) {
                float xh = (xv[i] - mu) * rstd;
                float d = rstd * (dv[i] * w[j] - mg - xh * mgx);
                dx[r * c + j] = d;
                put_half(h, r * c + j, d, fp16);
            }
        }
    }
    if (warp >= rows) return;  // a warp with no row writes no sums (the caller sizes partial so)
#pragma unroll
    for (int i = 0; i < LN_COLS; ++i) {
        int j = lane + 32 * i;
        if (j < c) {
            partial[warp * 2 * c + j] = sw[i];
            partial[warp * 2 * c + c + j] = sb[i];
        }
    }
}
"""
# False: the rule writes (dy·x̂, dy) for every row and sums them all (round 7's path)
ROW_SUMS = True
ROW_SUMS_MAX_COLS = 16 * 32  # LN_COLS columns a lane
ROW_SUMS_WARPS = 4224  # at most: 528 blocks of 8 warps, 4 on each of 132 SMs; 4 rows a warp or more


def _fits(x: Any, w: Any, b: Any) -> bool:
    return (fast(x) and fast(w) and fast(b) and x.ndim >= 1 and x.size
            and w.shape == b.shape == (x.shape[-1],))


def layer_norm_forward(be: Any, x: Any, w: Any, b: Any, op: Any) -> Any:
    """fused_forward["layer_norm"]: y = x̂·w + b, one warp per row."""
    if not _fits(x, w, b):
        return None
    c = x.shape[-1]
    rows = x.size // c
    y = _empty(x.shape, F32)
    tail = (np.float32(op.eps), halves.output_copy(y, be.precision), halves.fp16_flag(be.precision))
    if c % 4 == 0 and c <= 1024 and vectored(x, w, b, y):  # the row in registers, float4s
        kernel(SOURCE, "layer_norm_forward4")(*warps(rows), (x, w, b, y, rows, np.int32(c // 4), *tail))
    else:
        kernel(SOURCE, "layer_norm_forward")(*warps(rows), (x, w, b, y, rows, np.int32(c), *tail))
    return y


def layer_norm_rule(be: Any, grad: Any, out: Any, x: Any, w: Any, b: Any, op: Any
                    ) -> tuple | None:
    """fused["layer_norm"]: dx in one launch (x̂ recomputed from x), dw and db as one
    column sum of the (dy·x̂, dy) sums it writes, a row of them per warp (ROW_SUMS, widths up to
    512) or per row of x: already summed over the rows."""
    if not (_fits(x, w, b) and fast(grad) and grad.shape == x.shape):
        return None
    c = x.shape[-1]
    rows = x.size // c
    dx = _empty(x.shape, F32)
    tail = (np.int32(c), np.float32(op.eps), halves.output_copy(dx, be.precision),
            halves.fp16_flag(be.precision))
    if ROW_SUMS and c <= ROW_SUMS_MAX_COLS:
        blocks = min((rows + 31) // 32, ROW_SUMS_WARPS // 8)  # 8 warps a block, 4 rows a warp
        parts_rows = min(blocks * 8, rows)
        parts = _empty((parts_rows, 2 * c), F32)
        kernel(SOURCE, "layer_norm_backward_sums")((blocks,), (256,), (grad, x, w, dx, parts, rows,
                                                                        *tail))
    else:
        parts_rows = rows
        parts = _empty((rows, 2 * c), F32)
        kernel(SOURCE, "layer_norm_backward")(*warps(rows), (grad, x, w, dx, parts, rows, *tail))
    sums = _empty((2 * c,), F32)
    column_sums(parts, sums, parts_rows, 2 * c)
    return dx, sums[:c], sums[c:]

"""GELU (tanh form) on the GPU: the backend's gelu and its rule, one launch each (four floats a
thread where common.VECTORS and the size allow), with the constants of the reference (array.py's
GELU_SCALE = √(2/π), GELU_CUBIC = 0.044715). In bf16 or fp16 each writes its output's 16-bit copy
too: the MLP's second product reads y, the first one's backward reads dx (halves.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..array import GELU_CUBIC, GELU_SCALE
from . import halves, reductions
from .common import F32, HEADER, _empty, fast, kernel, launch, launch4, vectored
from .reductions import keep_sums, wide_chunks

SOURCE = HEADER + halves.HALF + halves.HALF4 + r"""
// GELU, tanh form: y = ½x(1 + tanh(k(x + a·x³))); its rule in one launch.
extern "C" __global__ void gelu_forward(const float* x, float* y, long long n, float k, float a,
                                        unsigned short* h, int fp16) {
    GRID_STRIDE(i, n) {
        float v = x[i], out = 0.5f * v * (1.f + tanhf(k * (v + a * v * v * v)));
        y[i] = out;
        put_half(h, i, out, fp16);
    }
}

extern "C" __global__ void gelu_backward(const float* g, const float* x, float* dx, long long n,
                                         float k, float a, unsigned short* h, int fp16) {
    GRID_STRIDE(i, n) {
        float v = x[i], t = tanhf(k * (v + a * v * v * v));
        float d = g[i] * (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * k * (1.f + 3.f * a * v * v));
        dx[i] = d;
        put_half(h, i, d, fp16);
    }
}

// The same, four floats a thread (n4 = n / 4): the same arithmetic per element, the same bits.
__device__ __forceinline__ float gelu1(float v, float k, float a) {
    return 0.5f * v * (1.f + tanhf(k * (v + a * v * v * v)));
}
__device__ __forceinline__ float gelu_grad1(float g, float v, float k, float a) {
    float t = tanhf(k * (v + a * v * v * v));
    return g * (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * k * (1.f + 3.f * a * v * v));
}
extern "C" __global__ void gelu_forward4(const float4* x, float4* y, long long n4, float k,
                                         float a, unsigned short* h, int fp16) {
    GRID_STRIDE(i, n4) {
        float4 v = x[i], o;
        o.x = gelu1(v.x, k, a); o.y = gelu1(v.y, k, a); o.z = gelu1(v.z, k, a); o.w = gelu1(v.w, k, a);
        y[i] = o;
        put_half4(h, i, o, fp16);
    }
}
extern "C" __global__ void gelu_backward4(const float4* g, const float4* x, float4* dx,
                                          long long n4, float k, float a, unsigned short* h,
                                          int fp16) {
    GRID_STRIDE(i, n4) {
        float4 v = x[i], d = g[i], o;
        o.x = gelu_grad1(d.x, v.x, k, a); o.y = gelu_grad1(d.y, v.y, k, a);
        o.z = gelu_grad1(d.z, v.z, k, a); o.w = gelu_grad1(d.w, v.w, k, a);
        dx[i] = o;
        put_half4(h, i, o, fp16);
    }
}
// The rule over (rows, 4·cols4) with da's column sums on the way (the Linear before GELU reads
// them as its db: no pass over da of its own), laid out as reductions.py's column_sum4_chunks: a
// thread owns 4 adjacent columns, a block 128 columns × 8 rows of threads, block (x, y) rows
// [y·chunk, (y+1)·chunk) into sums[y, c]; a fixed order throughout.
extern "C" __global__ void gelu_backward_sums4(const float4* g, const float4* x, float4* dx,
                                               float4* sums, long long rows, long long cols4,
                                               long long chunk, float k, float a,
                                               unsigned short* h, int fp16) {
    __shared__ float4 partial[8][32];
    long long c = blockIdx.x * 32LL + threadIdx.x;
    long long start = blockIdx.y * chunk;
    long long stop = start + chunk < rows ? start + chunk : rows;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c < cols4) {
#pragma unroll 4
        for (long long r = start + threadIdx.y; r < stop; r += 8) {
            long long i = r * cols4 + c;
            float4 v = x[i], d = g[i], o;
            o.x = gelu_grad1(d.x, v.x, k, a); o.y = gelu_grad1(d.y, v.y, k, a);
            o.z = gelu_grad1(d.z, v.z, k, a); o.w = gelu_grad1(d.w, v.w, k, a);
            dx[i] = o;
            put_half4(h, i, o, fp16);
            s.x += o.x; s.y += o.y; s.z += o.z; s.w += o.w;
        }
    }
    partial[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols4) {
        float4 total = partial[0][threadIdx.x];
        for (int j = 1; j < 8; ++j) {
            float4 p = partial[j][threadIdx.x];
            total.x += p.x; total.y += p.y; total.z += p.z; total.w += p.w;
        }
        sums[blockIdx.y * cols4 + c] = total;
    }
}
"""
_K, _A = np.float32(GELU_SCALE), np.float32(GELU_CUBIC)
# True: GELU's rule on a (rows, C) array with C a multiple of 4 (four a thread) sums da's columns
# as it writes da and keeps them for the Linear before it (its db); False: a column sum later.
SUMS = True


def gelu(x: Any, precision: str = "fp32") -> Any | None:
    """The backend's gelu on a contiguous float32 array, one launch (None: not ours to take)."""
    if not fast(x):
        return None
    y = _empty(x.shape, F32)
    tail = (_K, _A, halves.output_copy(y, precision), halves.fp16_flag(precision))
    if vectored(x, y):
        launch4(kernel(SOURCE, "gelu_forward4"), x.size, (x, y, x.size // 4, *tail))
    else:
        launch(kernel(SOURCE, "gelu_forward"), x.size, (x, y, x.size, *tail))
    return y


def gelu_rule(be: Any, grad: Any, out: Any, x: Any) -> tuple | None:
    """fused["gelu"]: da = dc·(½(1 + t) + ½x(1 − t²)·k(1 + 3a·x²)), t = tanh(k(x + a·x³))."""
    if not (fast(grad) and fast(x) and grad.shape == x.shape):
        return None
    dx = _empty(x.shape, F32)
    tail = (_K, _A, halves.output_copy(dx, be.precision), halves.fp16_flag(be.precision))
    cols = x.shape[-1] if x.ndim >= 2 else 0
    if SUMS and cols % 4 == 0 and cols and vectored(grad, x, dx):
        _rule_with_sums(grad, x, dx, x.size // cols, cols, tail)
    elif vectored(grad, x, dx):
        launch4(kernel(SOURCE, "gelu_backward4"), x.size, (grad, x, dx, x.size // 4, *tail))
    else:
        launch(kernel(SOURCE, "gelu_backward"), x.size, (grad, x, dx, x.size, *tail))
    return (dx,)


def _rule_with_sums(grad: Any, x: Any, dx: Any, rows: int, cols: int, tail: tuple) -> None:
    """GELU's rule in the column-sum layout (reductions.wide_chunks' chunks), da's column sums
    added over the chunks by column_sum and kept for the Linear that made x (keep_sums)."""
    chunk, chunks = wide_chunks(rows, cols)
    groups = (cols // 4 + 31) // 32
    partial = _empty((chunks, cols), F32)
    kernel(SOURCE, "gelu_backward_sums4")((groups, chunks), (32, 8),
                                          (grad, x, dx, partial, rows, cols // 4, chunk, *tail))
    sums = partial.reshape(cols) if chunks == 1 else _empty((cols,), F32)
    if chunks > 1:
        kernel(reductions.SOURCE, "column_sum")(((cols + 31) // 32,), (32, 32),
                                                (partial, sums, chunks, cols))
    keep_sums(dx, sums)

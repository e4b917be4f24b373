"""The fused attention on the GPU (autodiff/attention.py's Attention): one launch forward, the
online softmax a query row at a time; one launch backward, from O and the log-sum-exp.

float32, head widths 16, 32 and 64 (one kernel each, from one template); q, k, v and dO read
through their strides, so the heads' transposes cost no copy. They match the tiled reference
(tests/test_attention_fused_gpu.py) or decline: another width, dtype or layout runs the tiles.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .common import F32, HEADER, _empty, kernel

WIDTHS = (16, 32, 64)  # head widths D the kernels are compiled for; others decline
ROWS = 64  # rows per block: query rows (forward, dQ) or key rows (dK, dV), 1 or 2 threads each
QTILE = 16  # query rows the dK/dV blocks bring into shared memory at a time

SOURCE = HEADER + f"#define ROWS {ROWS}\n#define QTILE {QTILE}\n" + r"""
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
// Inside the kernel templates below: HD the head width, G threads per row (a 64-wide row's
// numbers would not fit in one thread's registers), P4 the float4s each of them holds.
#define D4 (HD / 4)
#define G (HD > 32 ? 2 : 1)
#define P4 (D4 / G)
#define THREADS (ROWS * G)
struct Strides { long long b, h, t; };  // in floats; the last dimension is contiguous
#define STRIDES(n) long long n##b, long long n##h, long long n##t
#define S_(n) Strides n = {n##b, n##h, n##t}
__device__ __forceinline__ long long at(Strides s, int b, int h, int t) {
    return b * s.b + h * s.h + (long long)t * s.t;
}
__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
    return fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, acc))));
}
__device__ __forceinline__ void axpy4(float4* y, float a, float4 x) {
    y->x = fmaf(a, x.x, y->x); y->y = fmaf(a, x.y, y->y);
    y->z = fmaf(a, x.z, y->z); y->w = fmaf(a, x.w, y->w);
}
// A row's dot product from its G threads' halves (lanes l and l ^ 16 share a row).
template <int HD> __device__ __forceinline__ float row_sum(float x) {
    if (G > 1) x += __shfl_xor_sync(0xffffffff, x, 16);
    return x;
}
// Which row of the block this thread serves, and which part of it (its first float4).
template <int HD> __device__ __forceinline__ void slot(int tid, int* r, int* part) {
    if (G == 1) { *r = tid; *part = 0; return; }
    *r = (tid >> 5) * 16 + (tid & 15);
    *part = (tid & 31) >> 4;
}

// O = softmax(q kᵀ·scale) v by the online softmax: G threads per query row, key tiles of ROWS
// in shared memory; lse = m + log l per row. Grid (query tiles, B·H).
#define FORWARD_ARGS const float* q, const float* k, const float* v, float* o, float* lse, \
        STRIDES(sq), STRIDES(sk), STRIDES(sv), STRIDES(so), int heads, int T, int S, float scale, \
        int causal
#define FORWARD_PASS q, k, v, o, lse, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, \
        heads, T, S, scale, causal
template <int HD> __device__ __forceinline__ void forward(FORWARD_ARGS) {
    S_(sq); S_(sk); S_(sv); S_(so);
    __shared__ float4 ks[ROWS][D4], vs[ROWS][D4];
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, tid = threadIdx.x, r, part;
    slot<HD>(tid, &r, &part);
    int row = blockIdx.x * ROWS + r, off = part * P4;
    float4 qr[P4], acc[P4];
    const float4* qp = (const float4*)(q + at(sq, b, h, min(row, T - 1))) + off;
    float c = scale * LOG2E;  // scores in base 2: exp2f is one instruction
    for (int d = 0; d < P4; ++d) {
        float4 x = qp[d];
        qr[d] = make_float4(x.x * c, x.y * c, x.z * c, x.w * c);
        acc[d] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m = NEG_INF, l = 0.f;
    int last = causal ? min(S, (blockIdx.x + 1) * ROWS) : S;
    for (int j0 = 0; j0 < last; j0 += ROWS) {
        __syncthreads();
        for (int i = tid; i < ROWS * D4; i += THREADS) {
            int j = i / D4, d = i % D4;
            bool in = j0 + j < S;
            float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
            ks[j][d] = in ? ((const float4*)(k + at(sk, b, h, j0 + j)))[d] : zero;
            vs[j][d] = in ? ((const float4*)(v + at(sv, b, h, j0 + j)))[d] : zero;
        }
        __syncthreads();
        for (int jc = 0; jc < ROWS; jc += 16) {
            float s[16], cm = NEG_INF;
#pragma unroll
            for (int u = 0; u < 16; ++u) {
                int key = j0 + jc + u;
                float x = 0.f;
#pragma unroll
                for (int d = 0; d < P4; ++d) x = dot4(qr[d], ks[jc + u][off + d], x);
                x = row_sum<HD>(x);
                s[u] = (key >= S || (causal && key > row)) ? NEG_INF : x;
                cm = fmaxf(cm, s[u]);
            }
            float mn = fmaxf(m, cm);
            if (mn != NEG_INF) {  // else every key so far is masked: nothing to add yet
                float alpha = exp2f(m - mn);  // m = −∞ the first time: alpha = 0
                l *= alpha;
#pragma unroll
                for (int d = 0; d < P4; ++d) {
                    acc[d].x *= alpha; acc[d].y *= alpha; acc[d].z *= alpha; acc[d].w *= alpha;
                }
#pragma unroll
                for (int u = 0; u < 16; ++u) {
                    float p = exp2f(s[u] - mn);
                    l += p;
#pragma unroll
                    for (int d = 0; d < P4; ++d) axpy4(&acc[d], p, vs[jc + u][off + d]);
                }
                m = mn;
            }
        }
    }
    if (row >= T) return;
    float inv = 1.f / l;
    float4* op = (float4*)(o + at(so, b, h, row)) + off;
    for (int d = 0; d < P4; ++d)
        op[d] = make_float4(acc[d].x * inv, acc[d].y * inv, acc[d].z * inv, acc[d].w * inv);
    if (part == 0) lse[(long long)bh * T + row] = (m + log2f(l)) * LN2;
}

// One launch, two kinds of block. Blocks x < key tiles: each key row j (G threads) holds dK_j,
// dV_j and walks the query tiles that see it: P = exp(q kᵀ·s − lse), dV += Pᵀ dO,
// dS = P ⊙ (dO Vᵀ − δ), dK += dSᵀ Q·s. The other blocks: each query row i holds dQ_i and walks
// the key tiles it sees: dQ += dS K·s. δ = rowsum(dO ⊙ O) is made where it is needed.
#define BACKWARD_ARGS const float* q, const float* k, const float* v, const float* o, \
        const float* g, const float* lse, float* dq, float* dk, float* dv, STRIDES(sq), \
        STRIDES(sk), STRIDES(sv), STRIDES(so), STRIDES(sg), STRIDES(sdq), STRIDES(sdk), \
        STRIDES(sdv), int heads, int T, int S, float scale, int causal
#define BACKWARD_PASS q, k, v, o, g, lse, dq, dk, dv, sqb, sqh, sqt, skb, skh, skt, svb, svh, \
        svt, sob, soh, sot, sgb, sgh, sgt, sdqb, sdqh, sdqt, sdkb, sdkh, sdkt, sdvb, sdvh, sdvt, \
        heads, T, S, scale, causal
template <int HD> __device__ __forceinline__ void backward(BACKWARD_ARGS) {
    S_(sq); S_(sk); S_(sv); S_(so); S_(sg); S_(sdq); S_(sdk); S_(sdv);
    __shared__ float4 qs[QTILE][D4], gs[QTILE][D4];
    // The block's own rows (k and v, or q and dO), one float4 of padding: row j's reads hit
    // other banks than row j+1's (in registers they would spill, beside the gradients).
    __shared__ float4 ks[ROWS][D4 + 1], vs[ROWS][D4 + 1];
    __shared__ float ls[QTILE], ds[QTILE];
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, tid = threadIdx.x, r, part;
    slot<HD>(tid, &r, &part);
    int off = part * P4, key_tiles = (S + ROWS - 1) / ROWS;
    float c = scale * LOG2E;
    if ((int)blockIdx.x < key_tiles) {
        int j0 = blockIdx.x * ROWS, key = j0 + r;
        float4 dkr[P4], dvr[P4];
        for (int i = tid; i < ROWS * D4; i += THREADS) {
            int j = i / D4, d = i % D4, kj = min(j0 + j, S - 1);
            ks[j][d] = ((const float4*)(k + at(sk, b, h, kj)))[d];
            vs[j][d] = ((const float4*)(v + at(sv, b, h, kj)))[d];
        }
        for (int d = 0; d < P4; ++d) dkr[d] = dvr[d] = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int i0 = causal ? (j0 / QTILE) * QTILE : 0; i0 < T; i0 += QTILE) {
            __syncthreads();
            for (int i = tid; i < QTILE * D4; i += THREADS) {
                int rr = i / D4, d = i % D4, qi = min(i0 + rr, T - 1);
                qs[rr][d] = ((const float4*)(q + at(sq, b, h, qi)))[d];
                gs[rr][d] = ((const float4*)(g + at(sg, b, h, qi)))[d];
            }
            if (tid < QTILE) {
                int qi = min(i0 + tid, T - 1);
                const float4* gp = (const float4*)(g + at(sg, b, h, qi));
                const float4* op = (const float4*)(o + at(so, b, h, qi));
                float x = 0.f;
                for (int d = 0; d < D4; ++d) x = dot4(gp[d], op[d], x);
                ds[tid] = x;
                ls[tid] = lse[(long long)bh * T + qi] * LOG2E;
            }
            __syncthreads();
            for (int rr = 0; rr < QTILE; ++rr) {
                int qi = i0 + rr;
                float x = 0.f, dp = 0.f;
#pragma unroll
                for (int d = 0; d < P4; ++d) x = dot4(qs[rr][off + d], ks[r][off + d], x);
                x = row_sum<HD>(x);
                bool out = qi >= T || key >= S || (causal && key > qi);
                float p = out ? 0.f : exp2f(x * c - ls[rr]);
#pragma unroll
                for (int d = 0; d < P4; ++d) {
                    axpy4(&dvr[d], p, gs[rr][off + d]);
                    dp = dot4(gs[rr][off + d], vs[r][off + d], dp);
                }
                float dsr = p * (row_sum<HD>(dp) - ds[rr]) * scale;
#pragma unroll
                for (int d = 0; d < P4; ++d) axpy4(&dkr[d], dsr, qs[rr][off + d]);
            }
        }
        if (key >= S) return;
        float4* dkp = (float4*)(dk + at(sdk, b, h, key)) + off;
        float4* dvp = (float4*)(dv + at(sdv, b, h, key)) + off;
        for (int d = 0; d < P4; ++d) { dkp[d] = dkr[d]; dvp[d] = dvr[d]; }
        return;
    }
    // dQ blocks: the tile's q and dO rows in ks/vs, key and value tiles in qs/gs.
    int tile = blockIdx.x - key_tiles, row = tile * ROWS + r, qi = min(row, T - 1);
    for (int i = tid; i < ROWS * D4; i += THREADS) {
        int j = i / D4, d = i % D4, qj = min(tile * ROWS + j, T - 1);
        ks[j][d] = ((const float4*)(q + at(sq, b, h, qj)))[d];
        vs[j][d] = ((const float4*)(g + at(sg, b, h, qj)))[d];
    }
    __syncthreads();
    float4 dqr[P4];
    const float4* op = (const float4*)(o + at(so, b, h, qi)) + off;
    float delta = 0.f;
    for (int d = 0; d < P4; ++d) {
        delta = dot4(vs[r][off + d], op[d], delta);
        dqr[d] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    delta = row_sum<HD>(delta);
    float l2 = lse[(long long)bh * T + qi] * LOG2E;
    int last = causal ? min(S, (tile + 1) * ROWS) : S;
    for (int j0 = 0; j0 < last; j0 += QTILE) {
        __syncthreads();
        for (int i = tid; i < QTILE * D4; i += THREADS) {
            int j = i / D4, d = i % D4, kj = min(j0 + j, S - 1);
            qs[j][d] = ((const float4*)(k + at(sk, b, h, kj)))[d];
            gs[j][d] = ((const float4*)(v + at(sv, b, h, kj)))[d];
        }
        __syncthreads();
        for (int j = 0; j < QTILE; ++j) {
            int key = j0 + j;
            float x = 0.f, dp = 0.f;
#pragma unroll
            for (int d = 0; d < P4; ++d) {
                x = dot4(ks[r][off + d], qs[j][off + d], x);
                dp = dot4(vs[r][off + d], gs[j][off + d], dp);
            }
            x = row_sum<HD>(x);
            dp = row_sum<HD>(dp);
            bool out = key >= S || (causal && key > row);
            float p = out ? 0.f : exp2f(x * c - l2);
            float dsr = p * (dp - delta) * scale;
#pragma unroll
            for (int d = 0; d < P4; ++d) axpy4(&dqr[d], dsr, qs[j][off + d]);
        }
    }
    if (row >= T) return;
    float4* dqp = (float4*)(dq + at(sdq, b, h, row)) + off;
    for (int d = 0; d < P4; ++d) dqp[d] = dqr[d];
}

// One kernel each way per head width (launched with 64 threads a block for D ≤ 32, 128 for 64).
extern "C" __global__ void flash_forward_16(FORWARD_ARGS) {
    forward<16>(FORWARD_PASS);
}
extern "C" __global__ void flash_forward_32(FORWARD_ARGS) {
    forward<32>(FORWARD_PASS);
}
extern "C" __global__ void flash_forward_64(FORWARD_ARGS) {
    forward<64>(FORWARD_PASS);
}
extern "C" __global__ void flash_backward_16(BACKWARD_ARGS) {
    backward<16>(BACKWARD_PASS);
}
extern "C" __global__ void flash_backward_32(BACKWARD_ARGS) {
    backward<32>(BACKWARD_PASS);
}
extern "C" __global__ void flash_backward_64(BACKWARD_ARGS) {
    backward<64>(BACKWARD_PASS);
}
"""


def _kernels(width: int) -> tuple[Any, Any]:
    """(forward, backward) for head width `width`: one module holds all three widths."""
    return {16: (kernel(SOURCE, "flash_forward_16"), kernel(SOURCE, "flash_backward_16")),
            32: (kernel(SOURCE, "flash_forward_32"), kernel(SOURCE, "flash_backward_32")),
            64: (kernel(SOURCE, "flash_forward_64"), kernel(SOURCE, "flash_backward_64"))}[width]


def _threads(width: int) -> int:
    return ROWS * (2 if width > 32 else 1)  # the kernels' G threads per row


def _strides(x: Any) -> tuple:
    """(b, h, t) strides in floats of a (B, H, T, D) or (N, T, D) array (N: B with one head)."""
    s = [st // 4 for st in x.strides[:-1]]
    return tuple(np.int64(v) for v in ((s[0], 0, s[1]) if x.ndim == 3 else s))


def _fits(*xs: Any) -> bool:
    """float32, 3-D or 4-D, rows contiguous and 16-byte aligned (the kernels read float4s)."""
    return all(type(x) is _empty and x.dtype == F32 and x.ndim in (3, 4)
               and x.strides[-1] == 4 and all(st % 16 == 0 for st in x.strides[:-1])
               and x.data.ptr % 16 == 0 for x in xs)


def _heads(x: Any) -> tuple[int, int]:
    return (x.shape[0], x.shape[1]) if x.ndim == 4 else (x.shape[0], 1)


def _like_heads(x: Any) -> Any:
    """An output of x's shape laid out (B, T, H, D) in memory: the heads' merge is then a view."""
    if x.ndim == 3:
        return _empty(x.shape, F32)
    b, h, t, d = x.shape
    return _empty((b, t, h, d), F32).transpose(0, 2, 1, 3)


def attention_forward(be: Any, q: Any, k: Any, v: Any, op: Any) -> Any:
    """fused_forward["attention"]: O and lse in one launch (declines what the kernel does not
    take: another width, dtype or layout, a value width unlike the key width)."""
    d = q.shape[-1]
    if d not in WIDTHS or v.shape[-1] != d or not _fits(q, k, v) or q.shape[:-2] != k.shape[:-2]:
        return None
    (batch, heads), t, s = _heads(q), q.shape[-2], k.shape[-2]
    out = _like_heads(q)
    lse = _empty(q.shape[:-1] + (1,), F32)
    grid = ((t + ROWS - 1) // ROWS, batch * heads)
    _kernels(d)[0](
        grid, (_threads(d),), (q, k, v, out, lse, *_strides(q), *_strides(k), *_strides(v),
                        *_strides(out), np.int32(heads), np.int32(t), np.int32(s), np.float32(op.factor(d)),
                        np.int32(op.causal)))
    op.saved = (lse,)
    return out


def attention_rule(be: Any, grad: Any, out: Any, q: Any, k: Any, v: Any, op: Any) -> Any:
    """fused["attention"]: dQ, dK, dV in one launch from O, lse and dO (declines as the forward,
    or when the saved lse is not the kernel's)."""
    d = q.shape[-1]
    lse = op.saved[0] if op.saved else None
    if (d not in WIDTHS or v.shape[-1] != d or not _fits(q, k, v, out, grad)
            or type(lse) is not _empty or not lse.flags.c_contiguous):
        return None
    (batch, heads), t, s = _heads(q), q.shape[-2], k.shape[-2]
    dq, dk, dv = _like_heads(q), _like_heads(k), _like_heads(v)
    grid = ((s + ROWS - 1) // ROWS + (t + ROWS - 1) // ROWS, batch * heads)
    _kernels(d)[1](
        grid, (_threads(d),), (q, k, v, out, grad, lse, dq, dk, dv,
                        *(s for x in (q, k, v, out, grad, dq, dk, dv) for s in _strides(x)),
                        np.int32(heads), np.int32(t), np.int32(s), np.float32(op.factor(d)),
                        np.int32(op.causal)))
    return dq, dk, dv


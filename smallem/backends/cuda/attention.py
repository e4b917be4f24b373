"""The fused attention on the GPU in float32 (autodiff/attention.py's Attention): one launch
forward, the online softmax a query row at a time; three launches backward as FlashAttention-2's
(δ = rowsum(dO ⊙ O), then dK and dV a key row at a time, then dQ a query row at a time).

Head widths 16, 32, 64 and 128, each its own kernels (G threads share a row: what a thread holds
stays in registers); q, k, v and dO read through their strides, so the heads' transposes cost no
copy. They match the tiled reference (tests/test_attention_fused_gpu.py) or decline.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import attention_mma, attention_tc
from .attention_tc import strides as _strides
from .common import F32, HEADER, _empty, kernel

WIDTHS = (16, 32, 64, 128)  # head widths D the kernels are compiled for; others decline
# Per width: G threads per row (each holds D / G of q, k, v, the accumulators: 32 numbers at
# most, so four rows of them fit in registers) and ROWS rows per block.
CONFIG = {16: (1, 128), 32: (1, 128), 64: (2, 64), 128: (4, 32)}  # timed: round6/
MAX_HEADS = 65535  # B·H is the grid's second dimension
# The bf16/fp16 kernels: round 7's "mma" (attention_mma.py: ldmatrix, cp.async double buffers)
# or round 6's "tc" (attention_tc.py), kept to compare in a bench; both match float64.
TENSOR_CORES = "mma"  # checked against float64 on the H200 (results/round7/)

KERNELS = r"""
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define FULL 0xffffffffu
struct Strides { long long b, h, t; };  // in floats; the last dimension is contiguous
#define STRIDES(n) long long n##b, long long n##h, long long n##t
#define S_(n) Strides n = {n##b, n##h, n##t}
__device__ __forceinline__ const float4* row4(const float* x, Strides s, int b, int h, int t) {
    return (const float4*)(x + b * s.b + h * s.h + (long long)t * s.t);
}
__device__ __forceinline__ float4* row4w(float* x, Strides s, int b, int h, int t) {
    return (float4*)(x + b * s.b + h * s.h + (long long)t * s.t);
}
__device__ __forceinline__ void fma4(float4* y, float4 a, float4 b) {  // y += a ⊙ b, 4 chains
    y->x = fmaf(a.x, b.x, y->x); y->y = fmaf(a.y, b.y, y->y);
    y->z = fmaf(a.z, b.z, y->z); y->w = fmaf(a.w, b.w, y->w);
}
__device__ __forceinline__ void axpy4(float4* y, float a, float4 x) {
    y->x = fmaf(a, x.x, y->x); y->y = fmaf(a, x.y, y->y);
    y->z = fmaf(a, x.z, y->z); y->w = fmaf(a, x.w, y->w);
}
__device__ __forceinline__ float4 scale4(float4 x, float a) {
    return make_float4(x.x * a, x.y * a, x.z * a, x.w * a);
}
__device__ __forceinline__ float hsum(float4 x) { return (x.x + x.y) + (x.z + x.w); }
// G threads share a row: lanes l, l ^ 32/G, ... (the same l % (32/G)) of one warp.
template <int G> __device__ __forceinline__ float row_sum(float x) {
#pragma unroll
    for (int o = 16; o >= 32 / G; o >>= 1) x += __shfl_xor_sync(FULL, x, o);
    return x;
}
// The thread's row in the block and its part: it holds float4s part, part + G, part + 2G, ...
// of the row (interleaved, so the G parts of a shared-memory row sit in different banks).
template <int G> __device__ __forceinline__ void slot(int* r, int* part) {
    int lane = threadIdx.x & 31, rows = 32 / G;
    *r = (threadIdx.x >> 5) * rows + lane % rows;
    *part = lane / rows;
}
// Rows of a shared tile: 64 at most, 32 KiB of K and V (or Q and dO) at any width.
template <int HD> struct Tile { enum { D4 = HD / 4, N = 4096 / HD < 64 ? 4096 / HD : 64 }; };
template <int HD> __device__ __forceinline__ void load_tiles(
        float4 (*a)[HD / 4], float4 (*c)[HD / 4], const float* x, Strides sx, const float* y,
        Strides sy, int b, int h, int first, int rows, int last) {
    for (int i = threadIdx.x; i < rows * (HD / 4); i += blockDim.x) {
        int j = i / (HD / 4), d = i % (HD / 4), t = min(first + j, last);
        a[j][d] = row4(x, sx, b, h, t)[d];
        c[j][d] = row4(y, sy, b, h, t)[d];
    }
}

// O = softmax(q kᵀ·scale) v by the online softmax: ROWS query rows a block, G threads a row
// (q and the output accumulator in registers), key tiles in shared memory read by all rows;
// lse = m + log l per row. Grid (query tiles, B·H), the longest causal rows first.
#define FORWARD_ARGS const float* q, const float* k, const float* v, float* o, float* lse, \
        STRIDES(sq), STRIDES(sk), STRIDES(sv), STRIDES(so), int heads, int T, int S, float scale, \
        int causal
template <int HD, int G, int ROWS> __device__ __forceinline__ void forward(FORWARD_ARGS) {
    enum { D4 = HD / 4, P4 = D4 / G, KT = Tile<HD>::N };
    S_(sq); S_(sk); S_(sv); S_(so);
    __shared__ float4 ks[KT][D4], vs[KT][D4];
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, r, part;
    slot<G>(&r, &part);
    int tile = gridDim.x - 1 - blockIdx.x, row = tile * ROWS + r;
    float c = scale * LOG2E;  // scores in base 2: exp2f is one instruction
    float4 qr[P4], acc[P4];
    const float4* qp = row4(q, sq, b, h, min(row, T - 1));
#pragma unroll
    for (int d = 0; d < P4; ++d) {
        qr[d] = scale4(qp[d * G + part], c);
        acc[d] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m = NEG_INF, l = 0.f;
    int last = causal ? min(S, (tile + 1) * ROWS) : S;
    for (int j0 = 0; j0 < last; j0 += KT) {
        __syncthreads();
        load_tiles<HD>(ks, vs, k, sk, v, sv, b, h, j0, KT, S - 1);
        __syncthreads();
        for (int jc = 0; jc < KT && j0 + jc < last; jc += 16) {  // the same for the whole block
            float s[16], cm = NEG_INF;
#pragma unroll
            for (int u = 0; u < 16; ++u) {
                int key = j0 + jc + u;
                float4 x4 = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int d = 0; d < P4; ++d) fma4(&x4, qr[d], ks[jc + u][d * G + part]);
                float x = row_sum<G>(hsum(x4));
                s[u] = (key >= S || (causal && key > row)) ? NEG_INF : x;
                cm = fmaxf(cm, s[u]);
            }
            float mn = fmaxf(m, cm);
            if (mn != NEG_INF) {  // else every key so far is masked: nothing to add yet
                float alpha = exp2f(m - mn);  // m = −∞ the first time: alpha = 0
                l *= alpha;
#pragma unroll
                for (int d = 0; d < P4; ++d) acc[d] = scale4(acc[d], alpha);
#pragma unroll
                for (int u = 0; u < 16; ++u) {
                    float p = exp2f(s[u] - mn);
                    l += p;
#pragma unroll
                    for (int d = 0; d < P4; ++d) axpy4(&acc[d], p, vs[jc + u][d * G + part]);
                }
                m = mn;
            }
        }
    }
    if (row >= T) return;
    float inv = 1.f / l;
    float4* op = row4w(o, so, b, h, row);
#pragma unroll
    for (int d = 0; d < P4; ++d) op[d * G + part] = scale4(acc[d], inv);
    if (part == 0) lse[(long long)bh * T + row] = (m + log2f(l)) * LN2;
}

// The backward as FlashAttention-2's, in three launches. δ_i = rowsum(dO_i ⊙ O_i) first, a
// thread a row. Then dK, dV: ROWS key rows a block, each (G threads) holding k_j, v_j, dK_j, dV_j
// in registers, walking the query tiles that see it: p = exp(q·k·s − lse), dV += p dO,
// ds = p (dO·v − δ), dK += ds q·s. Then dQ the same way round: q_i, dO_i, dQ_i in registers,
// walking the key tiles: dQ += ds k·s. No atomics: each gradient row has one owner.
#define DELTA_ARGS const float* o, const float* g, float* delta, STRIDES(so), STRIDES(sg), \
        int heads, int T, int rows
template <int HD> __device__ __forceinline__ void row_delta(DELTA_ARGS) {
    S_(so); S_(sg);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    int t = i % T, bh = i / T, b = bh / heads, h = bh % heads;
    const float4 *op = row4(o, so, b, h, t), *gp = row4(g, sg, b, h, t);
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int d = 0; d < HD / 4; ++d) fma4(&x, op[d], gp[d]);
    delta[i] = hsum(x);
}

#define GRAD_ARGS const float* q, const float* k, const float* v, const float* g, \
        const float* lse, const float* delta, float* dx, float* dy, STRIDES(sq), STRIDES(sk), \
        STRIDES(sv), STRIDES(sg), STRIDES(sdx), STRIDES(sdy), int heads, int T, int S, \
        float scale, int causal
template <int HD, int G, int ROWS> __device__ __forceinline__ void key_grads(GRAD_ARGS) {
    enum { D4 = HD / 4, P4 = D4 / G, QT = Tile<HD>::N };
    S_(sq); S_(sk); S_(sv); S_(sg); S_(sdx); S_(sdy);
    __shared__ float4 qs[QT][D4], gs[QT][D4];
    __shared__ float ls[QT], ds[QT];
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, r, part;
    slot<G>(&r, &part);
    int j0 = blockIdx.x * ROWS, key = j0 + r, kj = min(key, S - 1);
    float c = scale * LOG2E;
    float4 kr[P4], vr[P4], dk[P4], dv[P4];
    const float4 *kp = row4(k, sk, b, h, kj), *vp = row4(v, sv, b, h, kj);
#pragma unroll
    for (int d = 0; d < P4; ++d) {
        kr[d] = scale4(kp[d * G + part], c);
        vr[d] = vp[d * G + part];
        dk[d] = dv[d] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const float* lrow = lse + (long long)bh * T;
    const float* drow = delta + (long long)bh * T;
    for (int i0 = causal ? (j0 / QT) * QT : 0; i0 < T; i0 += QT) {
        __syncthreads();
        load_tiles<HD>(qs, gs, q, sq, g, sg, b, h, i0, QT, T - 1);
        if (threadIdx.x < QT) {  // rows past T: lse = +∞ makes their p 0, δ = 0 their ds
            int qi = i0 + threadIdx.x;
            ls[threadIdx.x] = qi < T ? lrow[qi] * LOG2E : __int_as_float(0x7f800000);
            ds[threadIdx.x] = qi < T ? drow[qi] : 0.f;
        }
        __syncthreads();
        int n = min(QT, T - i0);
#pragma unroll 2
        for (int rr = 0; rr < n; ++rr) {
            float4 x4 = make_float4(0.f, 0.f, 0.f, 0.f), p4 = x4;
#pragma unroll
            for (int d = 0; d < P4; ++d) {
                fma4(&x4, qs[rr][d * G + part], kr[d]);
                fma4(&p4, gs[rr][d * G + part], vr[d]);
            }
            float x = row_sum<G>(hsum(x4)), dp = row_sum<G>(hsum(p4));
            float p = (causal && key > i0 + rr) ? 0.f : exp2f(x - ls[rr]);
            float dsr = p * (dp - ds[rr]);
#pragma unroll
            for (int d = 0; d < P4; ++d) {
                axpy4(&dv[d], p, gs[rr][d * G + part]);
                axpy4(&dk[d], dsr, qs[rr][d * G + part]);
            }
        }
    }
    if (key >= S) return;
    float4 *dkp = row4w(dx, sdx, b, h, key), *dvp = row4w(dy, sdy, b, h, key);
#pragma unroll
    for (int d = 0; d < P4; ++d) {
        dkp[d * G + part] = scale4(dk[d], scale);
        dvp[d * G + part] = dv[d];
    }
}

template <int HD, int G, int ROWS> __device__ __forceinline__ void query_grads(GRAD_ARGS) {
    enum { D4 = HD / 4, P4 = D4 / G, KT = Tile<HD>::N };
    S_(sq); S_(sk); S_(sv); S_(sg); S_(sdx);
    __shared__ float4 ks[KT][D4], vs[KT][D4];
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, r, part;
    slot<G>(&r, &part);
    int tile = gridDim.x - 1 - blockIdx.x, row = tile * ROWS + r, qi = min(row, T - 1);
    float c = scale * LOG2E;
    float4 qr[P4], gr[P4], dq[P4];
    const float4 *qp = row4(q, sq, b, h, qi), *gp = row4(g, sg, b, h, qi);
#pragma unroll
    for (int d = 0; d < P4; ++d) {
        qr[d] = scale4(qp[d * G + part], c);
        gr[d] = gp[d * G + part];
        dq[d] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float l2 = lse[(long long)bh * T + qi] * LOG2E, dl = delta[(long long)bh * T + qi];
    int last = causal ? min(S, (tile + 1) * ROWS) : S;
    for (int j0 = 0; j0 < last; j0 += KT) {
        __syncthreads();
        load_tiles<HD>(ks, vs, k, sk, v, sv, b, h, j0, KT, S - 1);
        __syncthreads();
        int n = min(KT, last - j0);
#pragma unroll 2
        for (int j = 0; j < n; ++j) {
            float4 x4 = make_float4(0.f, 0.f, 0.f, 0.f), p4 = x4;
#pragma unroll
            for (int d = 0; d < P4; ++d) {
                fma4(&x4, qr[d], ks[j][d * G + part]);
                fma4(&p4, gr[d], vs[j][d * G + part]);
            }
            float x = row_sum<G>(hsum(x4)), dp = row_sum<G>(hsum(p4));
            float p = (causal && j0 + j > row) ? 0.f : exp2f(x - l2);
            float dsr = p * (dp - dl);
#pragma unroll
            for (int d = 0; d < P4; ++d) axpy4(&dq[d], dsr, ks[j][d * G + part]);
        }
    }
    if (row >= T) return;
    float4* dqp = row4w(dx, sdx, b, h, row);
#pragma unroll
    for (int d = 0; d < P4; ++d) dqp[d * G + part] = scale4(dq[d], scale);
}
"""


def source(config: dict[int, tuple[int, int]]) -> str:
    """The CUDA source: for each width d, its kernels flash_<kind>_<d> with config[d]'s
    (G, ROWS); δ's kernel for every width. (A bench may compile another config as SOURCE.)"""
    one = ('extern "C" __global__ void flash_{kind}_{d}({args}) '
           '{{ {kind}<{d}, {g}, {rows}>({names}); }}\n')
    fwd = ("q, k, v, o, lse, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, heads, "
           "T, S, scale, causal")
    grad = ("q, k, v, g, lse, delta, dx, dy, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sgb, sgh, "
            "sgt, sdxb, sdxh, sdxt, sdyb, sdyh, sdyt, heads, T, S, scale, causal")
    out = [HEADER, KERNELS]
    for d, (g, rows) in config.items():
        out.append(one.format(kind="forward", d=d, g=g, rows=rows, args="FORWARD_ARGS",
                              names=fwd))
        for kind in ("key_grads", "query_grads"):
            out.append(one.format(kind=kind, d=d, g=g, rows=rows, args="GRAD_ARGS",
                                  names=grad))
    out += [f'extern "C" __global__ void flash_delta_{d}(DELTA_ARGS) {{ row_delta<{d}>(o, g, delta, '
            "sob, soh, sot, sgb, sgh, sgt, heads, T, rows); }\n" for d in WIDTHS]
    return "".join(out)


SOURCE = source(CONFIG)
_LOADED: dict[tuple[str, int], tuple] = {}  # (SOURCE, width) -> its four kernels


def _kernels(d: int) -> tuple[Any, Any, Any, Any]:
    """(forward, dK dV, dQ, δ) at width d, from SOURCE (compiled once, all widths in one module)."""
    key = (SOURCE, d)
    if key not in _LOADED:
        _LOADED[key] = {
            16: (kernel(SOURCE, "flash_forward_16"), kernel(SOURCE, "flash_key_grads_16"),
                 kernel(SOURCE, "flash_query_grads_16"), kernel(SOURCE, "flash_delta_16")),
            32: (kernel(SOURCE, "flash_forward_32"), kernel(SOURCE, "flash_key_grads_32"),
                 kernel(SOURCE, "flash_query_grads_32"), kernel(SOURCE, "flash_delta_32")),
            64: (kernel(SOURCE, "flash_forward_64"), kernel(SOURCE, "flash_key_grads_64"),
                 kernel(SOURCE, "flash_query_grads_64"), kernel(SOURCE, "flash_delta_64")),
            128: (kernel(SOURCE, "flash_forward_128"), kernel(SOURCE, "flash_key_grads_128"),
                  kernel(SOURCE, "flash_query_grads_128"), kernel(SOURCE, "flash_delta_128"))}[d]
    return _LOADED[key]


def _launch(fn: Any, d: int, size: int, heads: int, args: tuple) -> None:
    """One of the row kernels over `size` rows of B·H = `heads` heads, as CONFIG[d] says."""
    g, rows = CONFIG[d]
    fn(((size + rows - 1) // rows, heads), (rows * g,), args)


def _fits(*xs: Any) -> bool:
    """float32, 3-D or 4-D, rows contiguous and 16-byte aligned (the kernels read float4s)."""
    return all(type(x) is _empty and x.dtype == F32 and x.ndim in (3, 4)
               and x.strides[-1] == 4 and all(st % 16 == 0 for st in x.strides[:-1])
               and x.data.ptr % 16 == 0 for x in xs)


def _heads(x: Any) -> tuple[int, int]:
    return (x.shape[0], x.shape[1]) if len(x.shape) == 4 else (x.shape[0], 1)


def takes(q: Any, k: Any, v: Any) -> bool:
    """Whether the kernels take these shapes (the dtype and layout are _fits'): a compiled width,
    v as wide as k, the same leading dimensions, B·H within the grid."""
    d = q.shape[-1]
    return (d in WIDTHS and v.shape[-1] == d and q.shape[:-2] == k.shape[:-2]
            and int(np.prod(_heads(q))) <= MAX_HEADS)


def like_heads(x: Any, dtype: Any = F32) -> Any:
    """An output of x's shape laid out (B, T, H, D) in memory: the heads' merge is then a view."""
    if x.ndim == 3:
        return _empty(x.shape, dtype)
    b, h, t, d = x.shape
    return _empty((b, t, h, d), dtype).transpose(0, 2, 1, 3)


def tensor_format(be: Any, d: int) -> str | None:
    """The format the tensor-core kernels (attention_mma.py) read in this backend's precision, or
    None: fp32 and tf32 runs take the float32 kernels (tf32 rounds matrix products' inputs only,
    and these kernels are the float32 reference's arithmetic)."""
    precision = getattr(be, "precision", "fp32")
    return precision if precision in attention_tc.FORMATS and d in attention_tc.WIDTHS else None


def attention_forward(be: Any, q: Any, k: Any, v: Any, op: Any) -> Any:
    """fused_forward["attention"]: O and lse in one launch (declines what the kernels do not
    take: another width, dtype or layout, a value width unlike the key width)."""
    if not takes(q, k, v) or not _fits(q, k, v):
        return None
    d, (batch, heads), t, s = q.shape[-1], _heads(q), q.shape[-2], k.shape[-2]
    out = like_heads(q)
    lse = _empty(q.shape[:-1] + (1,), F32)
    fmt = tensor_format(be, d)
    if fmt:
        (attention_mma if TENSOR_CORES == "mma" else attention_tc).forward(
            q, k, v, out, lse, fmt, (batch, heads), op.factor(d), op.causal)
    else:
        _launch(_kernels(d)[0], d, t, batch * heads,
                (q, k, v, out, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
                 np.int32(heads), np.int32(t), np.int32(s), np.float32(op.factor(d)),
                 np.int32(op.causal)))
    op.saved = (lse,)
    return out


def attention_rule(be: Any, grad: Any, out: Any, q: Any, k: Any, v: Any, op: Any) -> Any:
    """fused["attention"]: dQ, dK, dV from O, lse and dO in three launches: δ, then dK and dV,
    then dQ (declines as the forward, or when the saved lse is not the kernel's)."""
    lse = op.saved[0] if op.saved else None
    if (not takes(q, k, v) or not _fits(q, k, v, out, grad) or type(lse) is not _empty
            or lse.dtype != F32 or not lse.flags.c_contiguous):
        return None
    d, (batch, heads), t, s = q.shape[-1], _heads(q), q.shape[-2], k.shape[-2]
    dq, dk, dv = like_heads(q), like_heads(k), like_heads(v)
    delta = _empty((batch * heads * t,), F32)
    forward, keys, queries, deltas = _kernels(d)
    fmt = tensor_format(be, d)
    if fmt and TENSOR_CORES == "mma":  # δ computed as dO is converted
        attention_mma.backward(q, k, v, grad, lse, delta, (dq, dk, dv), fmt, (batch, heads),
                               op.factor(d), op.causal, out=out)
        return dq, dk, dv
    deltas(((delta.size + 127) // 128,), (128,), (
        out, grad, delta, *_strides(out), *_strides(grad), np.int32(heads), np.int32(t),
        np.int32(delta.size)))
    if fmt:
        attention_tc.backward(q, k, v, grad, lse, delta, (dq, dk, dv), fmt, (batch, heads),
                              op.factor(d), op.causal)
        return dq, dk, dv
    tail = (np.int32(heads), np.int32(t), np.int32(s), np.float32(op.factor(d)), np.int32(op.causal))
    common = (q, k, v, grad, lse, delta)
    _launch(keys, d, s, batch * heads,
            (*common, dk, dv, *(n for x in (q, k, v, grad, dk, dv) for n in _strides(x)), *tail))
    _launch(queries, d, t, batch * heads,
            (*common, dq, dq, *(n for x in (q, k, v, grad, dq, dq) for n in _strides(x)), *tail))
    return dq, dk, dv

"""The fused attention on the tensor cores, for bf16 and fp16 runs (backends/precision.py): the
float32 kernels' algorithm (attention.py) with its matrix products as mma.sync m16n8k16.

q, k, v and dO are read as float32 and rounded to the format on their way into shared memory
(what the precision policy says a matrix product reads); scores, softmax statistics and every
accumulator stay float32, and P and dS are rounded to the format as the next product reads them.
A warp owns 16 rows; forward and dQ walk key tiles, dK and dV walk query tiles, no atomics.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .common import HEADER, kernel

WIDTHS = (16, 32, 64, 128)  # head widths (a multiple of the product's k = 16)
FORMATS = ("bf16", "fp16")
ROWS = 64  # the rows a block owns: 4 warps of 16
THREADS = 128


def other_rows(d: int) -> int:
    """Rows of the tile a block walks (keys or queries): fewer at width 128, for registers."""
    return 32 if d > 64 else 64


def shared_bytes(kind: str, d: int) -> int:
    """Dynamic shared memory of a block: its own rows and the walked tile, 16-bit numbers in
    rows padded by 8 (so a warp's fragment reads fall in 32 different banks)."""
    n, rows, cols = other_rows(d), d + 8, other_rows(d) + 8
    halves = {"forward": ROWS * rows + n * rows + d * cols,   # Q; K; Vᵀ
              "query": 2 * ROWS * rows + 2 * n * rows + d * cols,   # Q, dO; K, V; Kᵀ
              "key": 2 * ROWS * rows + 2 * n * rows + 2 * d * cols}[kind]  # K, V; Q, dO; Qᵀ, dOᵀ
    return 2 * halves + (8 * n if kind == "key" else 0)  # and the tile's lse, δ


KERNELS = r"""
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define FULL 0xffffffffu
typedef unsigned short half_t;  // a bf16 or fp16 number's bits
struct Strides { long long b, h, t; };
#define STRIDES(n) long long n##b, long long n##h, long long n##t
#define S_(n) Strides n = {n##b, n##h, n##t}
__device__ __forceinline__ const float* row_at(const float* x, Strides s, int b, int h, int t) {
    return x + b * s.b + h * s.h + (long long)t * s.t;
}
// Two float32 rounded to the format (to nearest even), packed: lo in the low 16 bits.
template <int F16> __device__ __forceinline__ unsigned pack(float lo, float hi) {
    unsigned r;
    if (F16) asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// c (16 × 8, float32) += a (16 × 16) · b (16 × 8), the PTX ISA's fragment layouts.
template <int F16> __device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0,
                                                       unsigned b1) {
    if (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned word(const half_t* p) { return *(const unsigned*)p; }

// C (16 × 8·NT) += A · Bᵀ: A's 16 rows from row `r0` of a [·][pitch] tile, K = 16·KC columns;
// B's rows (C's columns) from a [·][bpitch] tile. g = lane / 4, t = lane % 4 (PTX's names).
template <int F16, int KC, int NT> __device__ __forceinline__ void mma_abt(
        float (*c)[4], const half_t* a, int pitch, int r0, const half_t* bt, int bpitch) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
        const half_t* ap = a + (r0 + g) * pitch + kc * 16 + t * 2;
        unsigned f[4] = {word(ap), word(ap + 8 * pitch), word(ap + 8), word(ap + 8 * pitch + 8)};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const half_t* bp = bt + (nt * 8 + g) * bpitch + kc * 16 + t * 2;
            mma<F16>(c[nt], f, word(bp), word(bp + 8));
        }
    }
}
// C (16 × 8·NT) += P · Bᵀ with P (16 × 8·PT) in registers as float32 accumulators (rounded to
// the format here): an accumulator pair (n-tiles 2kc, 2kc + 1) is an A fragment as it stands.
template <int F16, int PT, int NT> __device__ __forceinline__ void mma_pbt(
        float (*c)[4], float (*p)[4], const half_t* bt, int bpitch) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int kc = 0; kc < PT / 2; ++kc) {
        unsigned f[4] = {pack<F16>(p[2 * kc][0], p[2 * kc][1]), pack<F16>(p[2 * kc][2], p[2 * kc][3]),
                         pack<F16>(p[2 * kc + 1][0], p[2 * kc + 1][1]),
                         pack<F16>(p[2 * kc + 1][2], p[2 * kc + 1][3])};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const half_t* bp = bt + (nt * 8 + g) * bpitch + kc * 16 + t * 2;
            mma<F16>(c[nt], f, word(bp), word(bp + 8));
        }
    }
}
// Rows first .. first + n of x (float32, D wide) into shared memory in the format: as rows
// (dst[j][d], pitch D + 8) and/or transposed (dstt[d][j], pitch n + 8). Rows from `limit` on are 0.
template <int F16, int HD> __device__ __forceinline__ void stage(
        half_t* dst, half_t* dstt, int n, const float* x, Strides s, int b, int h, int first,
        int limit) {
    for (int i = threadIdx.x; i < n * (HD / 4); i += blockDim.x) {
        int j = i / (HD / 4), d = (i % (HD / 4)) * 4;
        float4 v = first + j < limit ? *(const float4*)(row_at(x, s, b, h, first + j) + d)
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
        unsigned lo = pack<F16>(v.x, v.y), hi = pack<F16>(v.z, v.w);
        if (dst) *(uint2*)(dst + j * (HD + 8) + d) = make_uint2(lo, hi);
        if (dstt) {
            dstt[(d + 0) * (n + 8) + j] = lo & 0xffff; dstt[(d + 1) * (n + 8) + j] = lo >> 16;
            dstt[(d + 2) * (n + 8) + j] = hi & 0xffff; dstt[(d + 3) * (n + 8) + j] = hi >> 16;
        }
    }
}
__device__ __forceinline__ float quad_max(float x) {  // over the 4 threads of a row (same g)
    x = fmaxf(x, __shfl_xor_sync(FULL, x, 1));
    return fmaxf(x, __shfl_xor_sync(FULL, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(FULL, x, 1);
    return x + __shfl_xor_sync(FULL, x, 2);
}

#define TC_FORWARD_ARGS const float* q, const float* k, const float* v, float* o, float* lse, \
        STRIDES(sq), STRIDES(sk), STRIDES(sv), STRIDES(so), int heads, int T, int S, float scale, \
        int causal
// O by the online softmax: each warp 16 query rows (its S tile and O in registers), the block's
// Q and the walked K, Vᵀ tiles in shared memory. Grid (query tiles, B·H), longest rows first.
template <int F16, int HD, int N> __device__ __forceinline__ void tc_forward(TC_FORWARD_ARGS) {
    enum { M = 64, NT = N / 8, DT = HD / 8, KC = HD / 16, P = HD + 8 };
    S_(sq); S_(sk); S_(sv); S_(so);
    extern __shared__ __align__(16) half_t smem[];
    half_t *qs = smem, *ks = qs + M * P, *vt = ks + N * P;
    int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    int tile = gridDim.x - 1 - blockIdx.x, q0 = tile * M, warp = threadIdx.x >> 5;
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16;
    float c = scale * LOG2E, m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f}, acc[DT][4];
#pragma unroll
    for (int i = 0; i < DT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    stage<F16, HD>(qs, nullptr, M, q, sq, b, h, q0, T);
    int last = causal ? min(S, q0 + M) : S;
    for (int j0 = 0; j0 < last; j0 += N) {
        __syncthreads();
        stage<F16, HD>(ks, nullptr, N, k, sk, b, h, j0, S);
        stage<F16, HD>(nullptr, vt, N, v, sv, b, h, j0, S);
        __syncthreads();
        float s[NT][4];
#pragma unroll
        for (int i = 0; i < NT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
        mma_abt<F16, KC, NT>(s, qs, P, r0, ks, P);
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int key = j0 + i * 8 + t * 2 + (e & 1), row = q0 + r0 + g + (e >> 1) * 8;
                s[i][e] = (key >= S || (causal && key > row)) ? NEG_INF : s[i][e] * c;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[i][e]);
            }
        float base[2], alpha[2];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            float mn = fmaxf(m[x], quad_max(mx[x]));
            base[x] = mn == NEG_INF ? 0.f : mn;  // a row with no key yet: its p are all 0
            alpha[x] = exp2f(m[x] - base[x]);
            m[x] = mn;
            l[x] *= alpha[x];
        }
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[i][e] = exp2f(s[i][e] - base[e >> 1]);
                l[e >> 1] += s[i][e];  // this thread's part of the row sum; summed at the end
            }
#pragma unroll
        for (int i = 0; i < DT; ++i) {
            acc[i][0] *= alpha[0]; acc[i][1] *= alpha[0]; acc[i][2] *= alpha[1]; acc[i][3] *= alpha[1];
        }
        mma_pbt<F16, NT, DT>(acc, s, vt, N + 8);
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int row = q0 + r0 + g + x * 8;
        float sum = quad_sum(l[x]);
        if (row >= T) continue;
        float inv = 1.f / sum, *op = (float*)row_at(o, so, b, h, row);
#pragma unroll
        for (int i = 0; i < DT; ++i)
            *(float2*)(op + i * 8 + t * 2) = make_float2(acc[i][2 * x] * inv, acc[i][2 * x + 1] * inv);
        if (t == 0) lse[(long long)bh * T + row] = (m[x] + log2f(sum)) * LN2;
    }
}
"""

KERNELS_BACKWARD = r"""
#define TC_GRAD_ARGS const float* q, const float* k, const float* v, const float* g, \
        const float* lse, const float* delta, float* dx, float* dy, STRIDES(sq), STRIDES(sk), \
        STRIDES(sv), STRIDES(sg), STRIDES(sdx), STRIDES(sdy), int heads, int T, int S, \
        float scale, int causal
// dQ: each warp 16 query rows; per key tile S = Q Kᵀ, dP = dO Vᵀ, dS = P ⊙ (dP − δ), dQ += dS K.
template <int F16, int HD, int N> __device__ __forceinline__ void tc_query(TC_GRAD_ARGS) {
    enum { M = 64, NT = N / 8, DT = HD / 8, KC = HD / 16, P = HD + 8 };
    S_(sq); S_(sk); S_(sv); S_(sg); S_(sdx);
    extern __shared__ __align__(16) half_t smem[];
    half_t *qs = smem, *gs = qs + M * P, *ks = gs + M * P, *vs = ks + N * P, *kt = vs + N * P;
    int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    int tile = gridDim.x - 1 - blockIdx.x, q0 = tile * M, warp = threadIdx.x >> 5;
    int gi = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16;
    float c = scale * LOG2E, l2[2], dl[2], dq[DT][4];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int row = min(q0 + r0 + gi + x * 8, T - 1);
        l2[x] = lse[(long long)bh * T + row] * LOG2E;
        dl[x] = delta[(long long)bh * T + row];
    }
#pragma unroll
    for (int i = 0; i < DT; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
    stage<F16, HD>(qs, nullptr, M, q, sq, b, h, q0, T);
    stage<F16, HD>(gs, nullptr, M, g, sg, b, h, q0, T);
    int last = causal ? min(S, q0 + M) : S;
    for (int j0 = 0; j0 < last; j0 += N) {
        __syncthreads();
        stage<F16, HD>(ks, kt, N, k, sk, b, h, j0, S);
        stage<F16, HD>(vs, nullptr, N, v, sv, b, h, j0, S);
        __syncthreads();
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
        mma_abt<F16, KC, NT>(s, qs, P, r0, ks, P);
        mma_abt<F16, KC, NT>(dp, gs, P, r0, vs, P);
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int key = j0 + i * 8 + t * 2 + (e & 1), row = q0 + r0 + gi + (e >> 1) * 8;
                float p = (key >= S || (causal && key > row)) ? 0.f : exp2f(s[i][e] * c - l2[e >> 1]);
                s[i][e] = p * (dp[i][e] - dl[e >> 1]);
            }
        mma_pbt<F16, NT, DT>(dq, s, kt, N + 8);
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int row = q0 + r0 + gi + x * 8;
        if (row >= T) continue;
        float* op = (float*)row_at(dx, sdx, b, h, row);
#pragma unroll
        for (int i = 0; i < DT; ++i)
            *(float2*)(op + i * 8 + t * 2) = make_float2(dq[i][2 * x] * scale, dq[i][2 * x + 1] * scale);
    }
}

// dK, dV: each warp 16 key rows; per query tile Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ = exp(Sᵀ·s − lse),
// dSᵀ = Pᵀ ⊙ (dPᵀ − δ), dV += Pᵀ dO, dK += dSᵀ Q. Grid (key tiles, B·H), longest first.
template <int F16, int HD, int N> __device__ __forceinline__ void tc_key(TC_GRAD_ARGS) {
    enum { M = 64, NT = N / 8, DT = HD / 8, KC = HD / 16, P = HD + 8 };
    S_(sq); S_(sk); S_(sv); S_(sg); S_(sdx); S_(sdy);
    extern __shared__ __align__(16) half_t smem[];
    half_t *ks = smem, *vs = ks + M * P, *qs = vs + M * P, *gs = qs + N * P, *qt = gs + N * P;
    half_t* gt = qt + HD * (N + 8);
    float *ls = (float*)(gt + HD * (N + 8)), *ds = ls + N;
    int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    int k0 = blockIdx.x * M, warp = threadIdx.x >> 5;
    int gi = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16;
    float c = scale * LOG2E, dk[DT][4], dv[DT][4];
#pragma unroll
    for (int i = 0; i < DT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
    stage<F16, HD>(ks, nullptr, M, k, sk, b, h, k0, S);
    stage<F16, HD>(vs, nullptr, M, v, sv, b, h, k0, S);
    for (int i0 = causal ? (k0 / N) * N : 0; i0 < T; i0 += N) {
        __syncthreads();
        stage<F16, HD>(qs, qt, N, q, sq, b, h, i0, T);
        stage<F16, HD>(gs, gt, N, g, sg, b, h, i0, T);
        if (threadIdx.x < N) {  // queries past T: lse = +∞ makes p 0, δ = 0 makes dS 0
            int qi = i0 + threadIdx.x;
            ls[threadIdx.x] = qi < T ? lse[(long long)bh * T + qi] * LOG2E : __int_as_float(0x7f800000);
            ds[threadIdx.x] = qi < T ? delta[(long long)bh * T + qi] : 0.f;
        }
        __syncthreads();
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
        mma_abt<F16, KC, NT>(s, ks, P, r0, qs, P);
        mma_abt<F16, KC, NT>(dp, vs, P, r0, gs, P);
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int col = i * 8 + t * 2 + (e & 1), key = k0 + r0 + gi + (e >> 1) * 8;
                float p = (causal && key > i0 + col) ? 0.f : exp2f(s[i][e] * c - ls[col]);
                s[i][e] = p;
                dp[i][e] = p * (dp[i][e] - ds[col]);
            }
        mma_pbt<F16, NT, DT>(dv, s, gt, N + 8);
        mma_pbt<F16, NT, DT>(dk, dp, qt, N + 8);
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int key = k0 + r0 + gi + x * 8;
        if (key >= S) continue;
        float *kp = (float*)row_at(dx, sdx, b, h, key), *vp = (float*)row_at(dy, sdy, b, h, key);
#pragma unroll
        for (int i = 0; i < DT; ++i) {
            *(float2*)(kp + i * 8 + t * 2) = make_float2(dk[i][2 * x] * scale, dk[i][2 * x + 1] * scale);
            *(float2*)(vp + i * 8 + t * 2) = make_float2(dv[i][2 * x], dv[i][2 * x + 1]);
        }
    }
}
"""


@cache
def source() -> str:
    """Every kernel: flash_tc_<kind>_<format>_<width>, kind forward, query (dQ), key (dK, dV)."""
    fwd = ("q, k, v, o, lse, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, heads, T, "
           "S, scale, causal")
    grad = ("q, k, v, g, lse, delta, dx, dy, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sgb, sgh, "
            "sgt, sdxb, sdxh, sdxt, sdyb, sdyh, sdyt, heads, T, S, scale, causal")
    out = [HEADER, KERNELS, KERNELS_BACKWARD]
    for fmt in FORMATS:
        for d in WIDTHS:
            f16, n = int(fmt == "fp16"), other_rows(d)
            out.append(f'extern "C" __global__ void flash_tc_forward_{fmt}_{d}(TC_FORWARD_ARGS) '
                       f"{{ tc_forward<{f16}, {d}, {n}>({fwd}); }}\n")
            for kind in ("query", "key"):
                out.append(f'extern "C" __global__ void flash_tc_{kind}_{fmt}_{d}(TC_GRAD_ARGS) '
                           f"{{ tc_{kind}<{f16}, {d}, {n}>({grad}); }}\n")
    return "".join(out)



_READY: set[tuple[str, str, int]] = set()


def tc_kernel(kind: str, fmt: str, d: int) -> Any:
    """The kernel, allowed the dynamic shared memory it takes (past the 48 KiB default)."""
    fn = kernel(source(), f"flash_tc_{kind}_{fmt}_{d}")
    if (kind, fmt, d) not in _READY:
        fn.max_dynamic_shared_size_bytes = shared_bytes(kind, d)
        _READY.add((kind, fmt, d))
    return fn


def forward(q: Any, k: Any, v: Any, out: Any, lse: Any, fmt: str, heads: tuple[int, int],
            strides: tuple, scale: float, causal: bool) -> None:
    """O and lse into `out`, `lse` (float32), q, k, v read in `fmt`; strides as attention.py's."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    tc_kernel("forward", fmt, d)(((t + ROWS - 1) // ROWS, batch * h), (THREADS,), (
        q, k, v, out, lse, *strides, np.int32(h), np.int32(t), np.int32(s), np.float32(scale),
        np.int32(causal)), shared_mem=shared_bytes("forward", d))


def backward(args: tuple, fmt: str, heads: tuple[int, int], t: int, s: int, d: int) -> None:
    """dK, dV then dQ; `args` as the float32 kernels take them, δ computed (attention.py)."""
    (batch, h) = heads
    keys, queries = args
    tc_kernel("key", fmt, d)(((s + ROWS - 1) // ROWS, batch * h), (THREADS,), keys,
                             shared_mem=shared_bytes("key", d))
    tc_kernel("query", fmt, d)(((t + ROWS - 1) // ROWS, batch * h), (THREADS,), queries,
                               shared_mem=shared_bytes("query", d))

"""The fused attention on the tensor cores, second version (round 7, issue 37): FlashAttention-2's
layout on mma.sync m16n8k16 for bf16 and fp16 runs. attention.py picks it (or round 6's
attention_tc.py) by `attention.TENSOR_CORES`; the backward kernels are in attention_mma_grad.py.

What changed from attention_tc.py: every fragment is read by ldmatrix (.trans where a product
reads a tile transposed, so no transposed copy is made), the walked K/V (or Q/dO) tiles are
copied by cp.async into a second buffer while the tensor cores work on the first, a block's own
rows are read from the float32 inputs directly (rounded once, as they land in shared memory),
only the causal diagonal and the last tiles are masked, and a warp whose rows see none of a tile's
keys skips it. Rows in shared memory are padded by 8 numbers, so ldmatrix's 8 rows hit 32 banks.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .attention_mma_grad import KERNELS_BACKWARD
from .attention_tc import FORMATS, U16, WIDTHS, padded, strides
from .common import HEADER, _empty, kernel

__all__ = ["FORMATS", "WIDTHS", "CONFIG", "source", "forward", "backward", "shared_bytes"]

# kind -> width -> (warps of 16 own rows, rows of the walked tile): forward, dQ (query), dK/dV (key)
CONFIG = {"forward": {16: (4, 64), 32: (4, 64), 64: (4, 64), 128: (4, 64)},
          "query": {16: (4, 64), 32: (4, 64), 64: (4, 64), 128: (4, 32)},
          "key": {16: (4, 64), 32: (4, 64), 64: (4, 64), 128: (4, 32)}}
# dQ by atomics inside the key kernel (FlashAttention-2's backward, 5 products) or by its own pass
# over key tiles (7 products, no atomics: the result does not depend on the order of additions)
DQ_BY_ATOMICS = False


def shared_bytes(kind: str, d: int, config: dict | None = None) -> int:
    """A block's dynamic shared memory: its own rows (Q; Q, dO; K, V), two buffers of the walked
    tiles (K, V; K, V; Q, dO) in 16-bit numbers, rows padded by 8; the key kernels' lse, δ, and
    keyq's dSᵀ tile."""
    w, n = (config or CONFIG)["key" if kind == "keyq" else kind][d]
    own = (1 if kind == "forward" else 2) * 16 * w
    extra = {"key": 16 * n, "keyq": 16 * n + 2 * 16 * w * (n + 8)}.get(kind, 0)  # + keyq's dSᵀ
    return 2 * (own + 4 * n) * (d + 8) + extra


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
__device__ __forceinline__ unsigned sm(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(void* dst, const void* src) {  // global -> shared, async
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sm(dst)), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
// Four 8 × 8 matrices of 16-bit numbers; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldsm(unsigned* r, const half_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(sm(p)));
}
__device__ __forceinline__ void ldsm_t(unsigned* r, const half_t* p) {  // each matrix transposed
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(sm(p)));
}
// An A fragment: rows r0 .. r0 + 15, columns k0 .. k0 + 15 of a row-major tile.
__device__ __forceinline__ void frag_a(unsigned* a, const half_t* x, int pitch, int r0, int k0) {
    int l = threadIdx.x & 31;
    ldsm(a, x + (r0 + (l & 15)) * pitch + k0 + (l >> 4) * 8);
}
// B fragments of two n-tiles when B[k][n] = x[n][k] (x's rows are C's columns): rows n0 .. n0 + 15,
// columns k0 .. k0 + 15. b[0], b[1]: n-tile n0; b[2], b[3]: n-tile n0 + 8.
__device__ __forceinline__ void frag_b(unsigned* b, const half_t* x, int pitch, int n0, int k0) {
    int l = threadIdx.x & 31;
    ldsm(b, x + (n0 + (l & 7) + (l >> 4) * 8) * pitch + k0 + ((l >> 3) & 1) * 8);
}
// An A fragment when A[m][k] = x[k][m] (a tile read transposed): rows k0 .. k0 + 15 of x are A's
// columns, x's columns m0 .. m0 + 15 its rows.
__device__ __forceinline__ void frag_at(unsigned* a, const half_t* x, int pitch, int k0, int m0) {
    int l = threadIdx.x & 31;
    ldsm_t(a, x + (k0 + (l & 7) + (l >> 4) * 8) * pitch + m0 + ((l >> 3) & 1) * 8);
}
// The same when B[k][n] = x[k][n] (a tile read transposed): rows k0 .. k0 + 15, columns n0 .. n0 + 15.
__device__ __forceinline__ void frag_bt(unsigned* b, const half_t* x, int pitch, int k0, int n0) {
    int l = threadIdx.x & 31;
    ldsm_t(b, x + (k0 + (l & 7) + ((l >> 3) & 1) * 8) * pitch + n0 + (l >> 4) * 8);
}
// C (16 × 8·NT) += A · Bᵀ: A the 16 rows from r0 of tile a, B's rows the NT·8 rows of tile b,
// both HD = 16·KC wide, pitch P.
template <int F16, int KC, int NT, int P> __device__ __forceinline__ void mma_abt(
        float (*c)[4], const half_t* a, int r0, const half_t* b) {
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
        unsigned f[4];
        frag_a(f, a, P, r0, kc * 16);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned w[4];
            frag_b(w, b, P, np * 16, kc * 16);
            mma<F16>(c[2 * np], f, w[0], w[1]);
            mma<F16>(c[2 * np + 1], f, w[2], w[3]);
        }
    }
}
// C (16 × 8·NT) += P · B: P (16 × 8·PT) float32 accumulators, rounded here (an accumulator pair
// of n-tiles 2kc, 2kc + 1 is an A fragment as it stands); B the tile b (PT·8 rows, pitch P).
template <int F16, int PT, int NT, int P> __device__ __forceinline__ void mma_pb(
        float (*c)[4], float (*p)[4], const half_t* b) {
#pragma unroll
    for (int kc = 0; kc < PT / 2; ++kc) {
        unsigned f[4] = {pack<F16>(p[2 * kc][0], p[2 * kc][1]), pack<F16>(p[2 * kc][2], p[2 * kc][3]),
                         pack<F16>(p[2 * kc + 1][0], p[2 * kc + 1][1]),
                         pack<F16>(p[2 * kc + 1][2], p[2 * kc + 1][3])};
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned w[4];
            frag_bt(w, b, P, kc * 16, np * 16);
            mma<F16>(c[2 * np], f, w[0], w[1]);
            mma<F16>(c[2 * np + 1], f, w[2], w[3]);
        }
    }
}
// n rows of a padded 16-bit (·, HD) array (already at the first row) into a [n][HD + 8] tile, async.
template <int HD, int NTH> __device__ __forceinline__ void tile_async(half_t* dst, const half_t* src, int n) {
#pragma unroll 4
    for (int i = threadIdx.x; i < n * (HD / 8); i += NTH) {
        int j = i / (HD / 8), c = (i % (HD / 8)) * 8;
        cp16(dst + j * (HD + 8) + c, src + (long long)j * HD + c);
    }
}
// A block's own n rows from row `first` of x (float32, strided), rounded, into a [n][HD + 8]
// tile; zeros past T.
template <int F16, int HD, int NTH> __device__ __forceinline__ void own_rows(
        half_t* dst, const float* x, Strides s, int b, int h, int first, int n, int T) {
    for (int i = threadIdx.x; i < n * (HD / 4); i += NTH) {
        int j = i / (HD / 4), c = (i % (HD / 4)) * 4;
        float4 v = first + j < T ? *(const float4*)(row_at(x, s, b, h, first + j) + c)
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
        *(uint2*)(dst + j * (HD + 8) + c) = make_uint2(pack<F16>(v.x, v.y), pack<F16>(v.z, v.w));
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
// x (float32, strided) in the format, per head as rows (Tp, HD), zeros past T: 8 numbers a thread.
// Grid (Tp·HD / 8 / 256 rounded up, B·H).
#define MMA_CONVERT_ARGS const float* x, STRIDES(sx), half_t* out, int heads, int T, int Tp
template <int F16, int HD> __device__ __forceinline__ void to_rows(MMA_CONVERT_ARGS) {
    S_(sx);
    int i = blockIdx.x * blockDim.x + threadIdx.x, bh = blockIdx.y;
    if (i >= Tp * (HD / 8)) return;
    int row = i / (HD / 8), c = (i % (HD / 8)) * 8;
    uint4 r = make_uint4(0u, 0u, 0u, 0u);
    if (row < T) {
        const float* p = row_at(x, sx, bh / heads, bh % heads, row) + c;
        float4 a = *(const float4*)p, e = *(const float4*)(p + 4);
        r = make_uint4(pack<F16>(a.x, a.y), pack<F16>(a.z, a.w), pack<F16>(e.x, e.y), pack<F16>(e.z, e.w));
    }
    *(uint4*)(out + ((long long)bh * Tp + row) * HD + c) = r;
}

#define MMA_FORWARD_ARGS const float* q, const half_t* k, const half_t* v, float* o, float* lse, \
        STRIDES(sq), STRIDES(so), int heads, int T, int S, int Tp, int Sp, float scale, int causal
// O by the online softmax: each warp 16 query rows (S tile and O in registers), the block's Q
// and two buffers of K, V tiles in shared memory. Grid (query blocks, B·H), longest rows first.
template <int F16, int HD, int N, int W> __device__ __forceinline__ void mma_forward(MMA_FORWARD_ARGS) {
    enum { M = 16 * W, NTH = 32 * W, NT = N / 8, DT = HD / 8, KC = HD / 16, P = HD + 8 };
    S_(sq); S_(so);
    extern __shared__ __align__(16) half_t smem[];
    half_t *qs = smem, *kv = qs + M * P;  // kv: two buffers of [K tile; V tile]
    int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    int q0 = (gridDim.x - 1 - blockIdx.x) * M, warp = threadIdx.x >> 5;
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16, w0 = q0 + r0;
    const half_t *kb = k + (long long)bh * Sp * HD, *vb = v + (long long)bh * Sp * HD;
    int tiles = ((causal ? min(S, q0 + M) : S) + N - 1) / N;
    tile_async<HD, NTH>(kv, kb, N);
    tile_async<HD, NTH>(kv + N * P, vb, N);
    cp_commit();
    own_rows<F16, HD, NTH>(qs, q, sq, b, h, q0, M, T);
    float c = scale * LOG2E, m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f}, acc[DT][4];
#pragma unroll
    for (int i = 0; i < DT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    for (int j = 0; j < tiles; ++j) {
        if (j + 1 < tiles) {  // the next tile lands while this one is multiplied
            half_t* nx = kv + ((j + 1) & 1) * 2 * N * P;
            tile_async<HD, NTH>(nx, kb + (long long)(j + 1) * N * HD, N);
            tile_async<HD, NTH>(nx + N * P, vb + (long long)(j + 1) * N * HD, N);
        }
        cp_commit();
        cp_wait_one();
        __syncthreads();
        const half_t *ks = kv + (j & 1) * 2 * N * P, *vs = ks + N * P;
        int j0 = j * N;
        if (!causal || j0 <= w0 + 15) {  // else none of this warp's rows sees these keys
            float s[NT][4];
#pragma unroll
            for (int i = 0; i < NT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
            mma_abt<F16, KC, NT, P>(s, qs, r0, ks);
            if (j0 + N > S || (causal && j0 + N - 1 > w0)) {  // the diagonal or the last keys
#pragma unroll
                for (int i = 0; i < NT; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        int key = j0 + i * 8 + t * 2 + (e & 1), row = w0 + g + (e >> 1) * 8;
                        if (key >= S || (causal && key > row)) s[i][e] = NEG_INF;
                    }
            }
            float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
            for (int i = 0; i < NT; ++i) {
                mx[0] = fmaxf(mx[0], fmaxf(s[i][0], s[i][1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[i][2], s[i][3]));
            }
            float base[2], alpha[2];
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                float mn = fmaxf(m[x], quad_max(mx[x]) * c);
                base[x] = mn == NEG_INF ? 0.f : mn;  // a row with no key yet: its p are all 0
                alpha[x] = exp2f(m[x] - base[x]);
                m[x] = mn;
                l[x] *= alpha[x];
            }
#pragma unroll
            for (int i = 0; i < NT; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[i][e] = exp2f(fmaf(s[i][e], c, -base[e >> 1]));
                    l[e >> 1] += s[i][e];  // this thread's part of the row sum; summed at the end
                }
#pragma unroll
            for (int i = 0; i < DT; ++i) {
                acc[i][0] *= alpha[0]; acc[i][1] *= alpha[0]; acc[i][2] *= alpha[1]; acc[i][3] *= alpha[1];
            }
            mma_pb<F16, NT, DT, P>(acc, s, vs);
        }
        __syncthreads();  // before the next copy overwrites this buffer
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int row = w0 + g + x * 8;
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


@cache
def _source(config_key: tuple) -> str:
    config = {kind: dict(widths) for kind, widths in config_key}
    fwd = "q, k, v, o, lse, sqb, sqh, sqt, sob, soh, sot, heads, T, S, Tp, Sp, scale, causal"
    grad = ("q, k, v, g, qr, kr, vr, gr, lse, delta, dx, dy, dz, sqb, sqh, sqt, skb, skh, skt, svb, svh, "
            "svt, sgb, sgh, sgt, sdxb, sdxh, sdxt, sdyb, sdyh, sdyt, sdzb, sdzh, sdzt, heads, T, S, Tp, Sp, "
            "scale, causal")
    conv = "x, sxb, sxh, sxt, out, heads, T, Tp"
    out = [HEADER, KERNELS, KERNELS_BACKWARD]
    for fmt in FORMATS:
        for d in WIDTHS:
            f16 = int(fmt == "fp16")
            out.append(f'extern "C" __global__ void flash_mma_convert_{fmt}_{d}(MMA_CONVERT_ARGS) '
                       f"{{ to_rows<{f16}, {d}>({conv}); }}\n")
            w, n = config["forward"][d]
            out.append(f'extern "C" __global__ void flash_mma_forward_{fmt}_{d}(MMA_FORWARD_ARGS) '
                       f"{{ mma_forward<{f16}, {d}, {n}, {w}>({fwd}); }}\n")
            w, n = config["query"][d]
            out.append(f'extern "C" __global__ void flash_mma_query_{fmt}_{d}(MMA_GRAD_ARGS) '
                       f"{{ mma_query<{f16}, {d}, {n}, {w}>({grad}); }}\n")
            w, n = config["key"][d]
            for kind, dq in (("key", 0), ("keyq", 1)):
                out.append(f'extern "C" __global__ void flash_mma_{kind}_{fmt}_{d}(MMA_GRAD_ARGS) '
                           f"{{ mma_key<{f16}, {d}, {n}, {w}, {dq}>({grad}); }}\n")
    return "".join(out)


def source(config: dict | None = None) -> str:
    """Every kernel: flash_mma_<kind>_<format>_<width>, kind convert (rows in the format),
    forward, query (dQ), key (dK, dV), keyq (dK, dV and dQ by atomics); `config` (CONFIG's
    shape) for a bench's variants."""
    config = config or CONFIG
    return _source(tuple((kind, tuple(sorted(w.items()))) for kind, w in config.items()))


_READY: set[tuple] = set()


def mma_kernel(kind: str, fmt: str, d: int) -> Any:
    """The kernel, allowed the dynamic shared memory it takes (past the 48 KiB default)."""
    fn = kernel(source(), f"flash_mma_{kind}_{fmt}_{d}")
    if kind != "convert" and (fn, kind, d) not in _READY:
        fn.max_dynamic_shared_size_bytes = shared_bytes(kind, d)
        _READY.add((fn, kind, d))
    return fn


def to_rows(x: Any, fmt: str, heads: tuple[int, int]) -> Any:
    """x's values in `fmt`, per head as rows (Tp, D), zeros past T: the tiles the kernels walk
    are then whole and 16-byte aligned for cp.async."""
    (batch, h), t, d = heads, x.shape[-2], x.shape[-1]
    tp = padded(t)
    out = _empty((batch * h * tp * d,), U16)
    mma_kernel("convert", fmt, d)(((tp * d // 8 + 255) // 256, batch * h), (256,), (
        x, *strides(x), out, np.int32(h), np.int32(t), np.int32(tp)))
    return out


def _blocks(kind: str, d: int, n: int) -> tuple[int, int]:
    """(blocks over n own rows, threads a block)."""
    w = CONFIG["key" if kind == "keyq" else kind][d][0]
    return (n + 16 * w - 1) // (16 * w), 32 * w


def forward(q: Any, k: Any, v: Any, out: Any, lse: Any, fmt: str, heads: tuple[int, int],
            scale: float, causal: bool) -> None:
    """O and lse into `out`, `lse` (float32) from q, k, v (float32) read in `fmt`."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    kr, vr = to_rows(k, fmt, heads), to_rows(v, fmt, heads)
    blocks, threads = _blocks("forward", d, t)
    mma_kernel("forward", fmt, d)((blocks, batch * h), (threads,), (
        q, kr, vr, out, lse, *strides(q), *strides(out), np.int32(h), np.int32(t), np.int32(s),
        np.int32(padded(t)), np.int32(padded(s)), np.float32(scale), np.int32(causal)),
        shared_mem=shared_bytes("forward", d))


def backward(q: Any, k: Any, v: Any, grad: Any, lse: Any, delta: Any, grads: tuple, fmt: str,
             heads: tuple[int, int], scale: float, causal: bool) -> None:
    """dK, dV then dQ into `grads` (dq, dk, dv; float32), δ computed (attention.py)."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    dq, dk, dv = grads
    atomics = DQ_BY_ATOMICS
    walked = (q, grad) if atomics else (q, k, v, grad)  # the tiles some kernel walks
    made = dict(zip((id(x) for x in walked), (to_rows(x, fmt, heads) for x in walked)))
    rows = [made.get(id(x), made[id(q)]) for x in (q, k, v, grad)]  # an unread slot: any buffer
    tail = (np.int32(h), np.int32(t), np.int32(s), np.int32(padded(t)), np.int32(padded(s)),
            np.float32(scale), np.int32(causal))
    common = (q, k, v, grad, *rows, lse, delta)
    ins = tuple(n for x in (q, k, v, grad) for n in strides(x))
    outs = (dk, dv, dq, *strides(dk), *strides(dv), *strides(dq))
    if atomics:
        dq[...] = 0
    kind = "keyq" if atomics else "key"
    blocks, threads = _blocks(kind, d, s)
    mma_kernel(kind, fmt, d)((blocks, batch * h), (threads,), (*common, *_grad_args(outs, ins, tail)),
                             shared_mem=shared_bytes(kind, d))
    if not atomics:
        blocks, threads = _blocks("query", d, t)
        mma_kernel("query", fmt, d)((blocks, batch * h), (threads,), (*common, *_grad_args(
            (dq, dq, dq, *strides(dq), *strides(dq), *strides(dq)), ins, tail)),
            shared_mem=shared_bytes("query", d))


def _grad_args(outs: tuple, ins: tuple, tail: tuple) -> tuple:
    """MMA_GRAD_ARGS after lse, δ: dx, dy, dz, the inputs' strides, the outputs' strides, tail."""
    return (*outs[:3], *ins, *outs[3:], *tail)

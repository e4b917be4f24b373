"""The float32 fused attention as FlashAttention-2 computes it, on CUDA cores in exact float32
(issue 37): attention.FLOAT32 picks them or the row kernels (attention.py, attention_rows.py).

Forward: a block owns BM query rows; key and value tiles of BN rows come by cp.async into two
buffers while the block works on the previous pair. Each thread keeps a register tile of
S = Q Kᵀ (RI rows × RJ keys) and of O (the same rows × HD/KX columns); P goes through shared
memory between the two products. Backward: one pass per key tile (dK, dV in registers), walking
the query tiles that see it; dQ = dS K added by float4 atomics (zeroed, with δ = rowsum(dO ⊙ O),
by one pass before). Tile sizes per head width in CONFIG; widths 32, 64 and 128.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .attention_f32_grad import GRAD_KERNELS
from .common import HEADER, _empty, kernel, strides

WIDTHS = (32, 64, 128)
# Per width and kind: (BM query rows, BN key rows, NT threads) of a block, optionally the blocks
# a multiprocessor must hold (__launch_bounds__' second number: registers capped; 0 none), KX,
# the threads across the keys of S (16 unless given; BN/KX keys each, BM·KX/NT rows each) and,
# backward only, QB: 2 loads the next query tile while the block works on this one, 3 so into
# the one buffer during dQ's product (1 unless given) and DL, dK and dV's layout: 2 gives a warp 16
# keys × 64 columns, 3 so and dQ's 16 rows × 64 columns (attention_f32_grad.py; 1 unless given).
# (Round 11's SP, S and dP in two passes over the head width, never adopted: deleted in round 13.)
# The fastest of 3 per width on the H200 (results/round8/attention_f32.md), then of round 9's
# and 11's candidates (results/round9/, round11/attention_f32.md), each taken only where faster
# than the one before it at every T 512 … 4,096: width 64's forward with 8 threads across the
# keys (2-6 %), width 128's forward so too (7-9 %) and its backward with 4 × 4 tiles of S and dP a
# thread over 64 keys (20 % less time than round 8's (32, 64, 256), over the two calls); round
# 11: width 64's backward with QB 3 (2.1 % at T 512 and 1,024, 0.4 and 0.1 % at 2,048, 4,096).
CONFIG = {32: {"forward": (64, 64, 128, 2), "backward": (64, 64, 256, 2)},
          64: {"forward": (64, 64, 128, 2, 8), "backward": (64, 64, 256, 2, 16, 3)},
          128: {"forward": (64, 32, 128, 2, 8), "backward": (64, 64, 256, 0, 16)}}
# Where these kernels are measured faster than attention.py's row kernels at every T (512 …
# 4,096, each beside the rows in one run): attention.FLOAT32 = "auto" takes them there. Width
# 128 too since round 8's last call (1.40-1.48× faster than the rows, and than the unfused chain,
# at T 2,048 and 4,096; results/round8/final/attention_f32_h200.json).
MEASURED = (32, 64, 128)
SHARED_LIMIT = 227 * 1024  # bytes of shared memory a block may take on the H100/H200

KERNELS = r"""
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define FULL 0xffffffffu
#define POS_INF __int_as_float(0x7f800000)
struct Strides { long long b, h, t; };  // in floats; the last dimension is contiguous
#define STRIDES(n) long long n##b, long long n##h, long long n##t
#define S_(n) Strides n = {n##b, n##h, n##t}
__device__ __forceinline__ const float* at(const float* x, Strides s, int b, int h, int t) {
    return x + b * s.b + h * s.h + (long long)t * s.t;
}
__device__ __forceinline__ float* atw(float* x, Strides s, int b, int h, int t) {
    return x + b * s.b + h * s.h + (long long)t * s.t;
}
__device__ __forceinline__ void cp16(float* dst, const float* src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
// Rows first … first + R − 1 of x's head (b, h) into a shared tile of row pitch P floats, by
// cp.async; rows past `last` repeat row `last` (finite values the masks then zero).
template <int HD, int R, int P, int NT> __device__ __forceinline__ void tile_async(
        float* dst, const float* x, Strides s, int b, int h, int first, int last) {
    for (int i = threadIdx.x; i < R * (HD / 4); i += NT) {
        int r = i / (HD / 4), c = i % (HD / 4);
        cp16(dst + r * P + 4 * c, at(x, s, b, h, min(first + r, last)) + 4 * c);
    }
}
// W consecutive floats of shared memory (16- or 8-byte aligned) into registers.
template <int W> __device__ __forceinline__ void lds(float* r, const float* p) {
#pragma unroll
    for (int i = 0; i < W; i += (W % 4 == 0 ? 4 : (W % 2 == 0 ? 2 : 1))) {
        if (W % 4 == 0) {
            float4 t = *(const float4*)(p + i);
            r[i] = t.x; r[i + 1] = t.y; r[i + 2] = t.z; r[i + 3] = t.w;
        } else if (W % 2 == 0) {
            float2 t = *(const float2*)(p + i);
            r[i] = t.x; r[i + 1] = t.y;
        } else {
            r[i] = p[i];
        }
    }
}
// W floats of registers to global memory (16- or 8-byte aligned).
template <int W> __device__ __forceinline__ void stg(float* p, const float* r) {
#pragma unroll
    for (int i = 0; i < W; i += (W % 4 == 0 ? 4 : (W % 2 == 0 ? 2 : 1))) {
        if (W % 4 == 0) *(float4*)(p + i) = make_float4(r[i], r[i + 1], r[i + 2], r[i + 3]);
        else if (W % 2 == 0) *(float2*)(p + i) = make_float2(r[i], r[i + 1]);
        else p[i] = r[i];
    }
}
// The KX threads of a row of S (neighbouring lanes of one warp) agree on a value.
template <int KX> __device__ __forceinline__ float row_max(float x) {
#pragma unroll
    for (int o = KX / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(FULL, x, o));
    return x;
}
template <int KX> __device__ __forceinline__ float row_sum(float x) {
#pragma unroll
    for (int o = KX / 2; o > 0; o >>= 1) x += __shfl_xor_sync(FULL, x, o);
    return x;
}

// Thread (ty, tx) = (tid / KX, tid % KX) owns rows ty + SY·a (a < RI) of the block's BM and
// keys tx + KX·b (b < RJ) of a tile's BN: a warp reads 32/KX rows of Q (broadcast) and KX
// neighbouring rows of K (pitch HD + 4: 8 float4 lanes fall in 32 banks). O's columns: VW-wide
// pieces (tx + KX·e)·VW, e < NC, so a warp reads a row of V whole. P's pitch BN + KX puts the
// warp's 32/KX rows in different banks.
#define FORWARD_ARGS const float* q, const float* k, const float* v, float* o, float* lse, \
        STRIDES(sq), STRIDES(sk), STRIDES(sv), STRIDES(so), int heads, int T, int S, float scale, \
        int causal
template <int HD, int BM, int BN, int NT, int KX> __device__ __forceinline__ void fwd(
        FORWARD_ARGS) {
    enum { SY = NT / KX, RI = BM / SY, RJ = BN / KX, CW = HD / KX, VW = CW < 4 ? CW : 4,
           NC = CW / VW, PD = HD + 4, PP = BN + KX };
    extern __shared__ __align__(16) float smem[];
    float *qs = smem, *ks = qs + BM * PD, *vs = ks + 2 * BN * PD, *ps = vs + 2 * BN * PD;
    S_(sq); S_(sk); S_(sv); S_(so);
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, tx = threadIdx.x % KX,
        ty = threadIdx.x / KX;
    int i0 = (gridDim.x - 1 - blockIdx.x) * BM;  // the longest causal rows first
    int last = causal ? min(S, i0 + BM) : S, tiles = (last + BN - 1) / BN;
    tile_async<HD, BN, PD, NT>(ks, k, sk, b, h, 0, S - 1);
    tile_async<HD, BN, PD, NT>(vs, v, sv, b, h, 0, S - 1);
    cp_commit();
    float c = scale * LOG2E;  // scores in base 2: exp2f is one instruction
    for (int i = threadIdx.x; i < BM * (HD / 4); i += NT) {  // Q scaled as it lands
        int r = i / (HD / 4), cc = i % (HD / 4);
        float4 x = ((const float4*)at(q, sq, b, h, min(i0 + r, T - 1)))[cc];
        *(float4*)(qs + r * PD + 4 * cc) = make_float4(x.x * c, x.y * c, x.z * c, x.w * c);
    }
    float acc[RI][CW], m[RI], l[RI];  // l: this thread's part of the row sum (added at the end)
#pragma unroll
    for (int a = 0; a < RI; ++a) {
        m[a] = NEG_INF; l[a] = 0.f;
#pragma unroll
        for (int e = 0; e < CW; ++e) acc[a][e] = 0.f;
    }
    for (int n = 0; n < tiles; ++n) {
        int j0 = n * BN;
        const float *kt = ks + (n & 1) * BN * PD, *vt = vs + (n & 1) * BN * PD;
        if (n + 1 < tiles) {  // the next pair into the other buffers (read two tiles ago)
            tile_async<HD, BN, PD, NT>(ks + ((n + 1) & 1) * BN * PD, k, sk, b, h, j0 + BN, S - 1);
            tile_async<HD, BN, PD, NT>(vs + ((n + 1) & 1) * BN * PD, v, sv, b, h, j0 + BN, S - 1);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        float s[RI][RJ];
#pragma unroll
        for (int a = 0; a < RI; ++a)
#pragma unroll
            for (int j = 0; j < RJ; ++j) s[a][j] = 0.f;
#pragma unroll 4
        for (int d = 0; d < HD; d += 4) {
            float qa[RI][4], kb[RJ][4];
#pragma unroll
            for (int a = 0; a < RI; ++a) lds<4>(qa[a], qs + (ty + SY * a) * PD + d);
#pragma unroll
            for (int j = 0; j < RJ; ++j) lds<4>(kb[j], kt + (tx + KX * j) * PD + d);
#pragma unroll
            for (int a = 0; a < RI; ++a)
#pragma unroll
                for (int j = 0; j < RJ; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[a][j] = fmaf(qa[a][e], kb[j][e], s[a][j]);
        }
        if (j0 + BN > S || (causal && j0 + BN - 1 > i0)) {  // only edge tiles are masked
#pragma unroll
            for (int a = 0; a < RI; ++a)
#pragma unroll
                for (int j = 0; j < RJ; ++j) {
                    int key = j0 + tx + KX * j;
                    if (key >= S || (causal && key > i0 + ty + SY * a)) s[a][j] = NEG_INF;
                }
        }
#pragma unroll
        for (int a = 0; a < RI; ++a) {
            float mx = s[a][0];
#pragma unroll
            for (int j = 1; j < RJ; ++j) mx = fmaxf(mx, s[a][j]);
            float mn = fmaxf(m[a], row_max<KX>(mx)), base = mn == NEG_INF ? 0.f : mn;
            float alpha = exp2f(m[a] - base);  // m = −∞ the first time: alpha = 0
            m[a] = mn;
            l[a] *= alpha;
#pragma unroll
            for (int e = 0; e < CW; ++e) acc[a][e] *= alpha;
#pragma unroll
            for (int j = 0; j < RJ; ++j) {
                float p = exp2f(s[a][j] - base);
                l[a] += p;
                ps[(ty + SY * a) * PP + tx + KX * j] = p;
            }
        }
        __syncthreads();
#pragma unroll 2
        for (int j = 0; j < BN; j += 4) {
            float pa[RI][4];
#pragma unroll
            for (int a = 0; a < RI; ++a) lds<4>(pa[a], ps + (ty + SY * a) * PP + j);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                float vv[CW];
#pragma unroll
                for (int e = 0; e < NC; ++e) lds<VW>(vv + e * VW, vt + (j + u) * PD + (tx + KX * e) * VW);
#pragma unroll
                for (int a = 0; a < RI; ++a)
#pragma unroll
                    for (int e = 0; e < CW; ++e) acc[a][e] = fmaf(pa[a][u], vv[e], acc[a][e]);
            }
        }
        __syncthreads();  // before the next tile's copies and P overwrite these
    }
#pragma unroll
    for (int a = 0; a < RI; ++a) {
        float sum = row_sum<KX>(l[a]), inv = 1.f / sum;
        int row = i0 + ty + SY * a;
        if (row >= T) continue;
        float* op = atw(o, so, b, h, row);
#pragma unroll
        for (int e = 0; e < CW; ++e) acc[a][e] *= inv;
#pragma unroll
        for (int e = 0; e < NC; ++e) stg<VW>(op + (tx + KX * e) * VW, acc[a] + e * VW);
        if (tx == 0) lse[(long long)bh * T + row] = (m[a] + log2f(sum)) * LN2;
    }
}
"""


def tiles_of(tiles: tuple) -> tuple[int, int, int, int, int, int, int]:
    """(BM, BN, NT, blocks, KX, QB, DL) of a configuration's (BM, BN, NT[, blocks[, KX[, QB[,
    DL]]]]): blocks 0 sets no register cap; KX threads across the keys of S, 16 unless given; QB
    query buffers and DL dK, dV's layout of the backward, 1 unless given."""
    if not 3 <= len(tiles) <= 7:
        raise ValueError(f"tiles {tiles}: 3 to 7 numbers")
    bm, bn, nt, *rest = tiles
    rest = rest + [0, 16, 1, 1][len(rest):]
    return bm, bn, nt, rest[0], rest[1], rest[2], rest[3]


def shared_bytes(kind: str, d: int, config: dict | None = None) -> int:
    """The dynamic shared memory of one block of `kind` at width d."""
    bm, bn, _, _, kx, qb, *_ = tiles_of((config or CONFIG)[d][kind])
    pd, pp = d + 4, bn + kx
    if kind == "forward":  # Q, two K and two V tiles, P
        return 4 * ((bm + 4 * bn) * pd + bm * pp)
    nb = 2 if qb == 2 else 1  # query buffers: QB 3 reuses its one (attention_f32_grad.py)
    # K, V; nb each of Q, dO; P, dS; nb each of lse, δ
    return 4 * ((2 * bn + 2 * nb * bm) * pd + 2 * bm * pp + 2 * nb * bm)


def source(config: dict | None = None) -> str:
    """The CUDA source: per width d of `config` (CONFIG's shape, a bench's variants), the kernels
    flash32_forward_<d>, flash32_backward_<d> and flash32_delta_<d>."""
    config = config or CONFIG
    return _source(tuple((d, tuple(sorted(kinds.items()))) for d, kinds in config.items()))


@cache
def _source(config: tuple) -> str:
    fwd = ("q, k, v, o, lse, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, heads, "
           "T, S, scale, causal")
    grad = ("q, k, v, g, lse, delta, dq, dk, dv, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, "
            "sgb, sgh, sgt, sdqb, sdqh, sdqt, sdkb, sdkh, sdkt, sdvb, sdvh, sdvt, heads, T, S, "
            "scale, causal")
    out = [HEADER, KERNELS, GRAD_KERNELS]
    for d, kinds in config:
        tiles = dict(kinds)
        for kind, fn, args, names in (("forward", "fwd", "FORWARD_ARGS", fwd),
                                      ("backward", "bwd", "GRAD_ARGS", grad)):
            bm, bn, nt, least, kx, qb, dl = tiles_of(tiles[kind])  # least: blocks an SM holds
            bounds = f"{nt}, {least}" if least else f"{nt}"
            params = f"{d}, {bm}, {bn}, {nt}, {kx}" + (f", {qb}, {dl}" if kind == "backward" else "")
            out.append(f'extern "C" __global__ void __launch_bounds__({bounds}) flash32_{kind}_{d}'
                       f"({args}) {{ {fn}<{params}>({names}); }}\n")
        out.append(f'extern "C" __global__ void flash32_delta_{d}(DELTA_ARGS) {{ delta_zero<{d}>('
                   "o, g, delta, dq, sob, soh, sot, sgb, sgh, sgt, szb, szh, szt, heads, T, rows); }\n")
    return "".join(out)


_LOADED: dict[tuple[str, int], tuple] = {}  # (SOURCE, width) -> its three kernels


def _kernels(d: int) -> tuple[Any, Any, Any]:
    """(forward, backward, δ) at width d from SOURCE (a bench may set CONFIG and SOURCE), the
    first two allowed the dynamic shared memory they take (past the 48 KiB default)."""
    key = (SOURCE, d)
    if key not in _LOADED:
        found = {  # only d's names: a bench's SOURCE may hold one width
            32: lambda: (kernel(SOURCE, "flash32_forward_32"),
                         kernel(SOURCE, "flash32_backward_32"), kernel(SOURCE, "flash32_delta_32")),
            64: lambda: (kernel(SOURCE, "flash32_forward_64"),
                         kernel(SOURCE, "flash32_backward_64"), kernel(SOURCE, "flash32_delta_64")),
            128: lambda: (kernel(SOURCE, "flash32_forward_128"),
                          kernel(SOURCE, "flash32_backward_128"),
                          kernel(SOURCE, "flash32_delta_128"))}[d]()
        for fn, kind in zip(found, ("forward", "backward")):
            fn.max_dynamic_shared_size_bytes = shared_bytes(kind, d)
        _LOADED[key] = found
    return _LOADED[key]


def forward(q: Any, k: Any, v: Any, out: Any, lse: Any, heads: tuple[int, int], scale: float,
            causal: bool) -> None:
    """O and lse into `out`, `lse` from q, k, v (float32, rows 16-byte aligned: attention._fits)."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    bm, _, nt, *_ = tiles_of(CONFIG[d]["forward"])
    _kernels(d)[0](((t + bm - 1) // bm, batch * h), (nt,), (
        q, k, v, out, lse, *strides(q), *strides(k), *strides(v), *strides(out), np.int32(h),
        np.int32(t), np.int32(s), np.float32(scale), np.int32(causal)),
        shared_mem=shared_bytes("forward", d))


def backward(q: Any, k: Any, v: Any, grad: Any, out: Any, lse: Any, grads: tuple,
             heads: tuple[int, int], scale: float, causal: bool) -> None:
    """dQ, dK, dV into `grads` (float32): δ and dQ's zeros, then the key tiles' pass."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    dq, dk, dv = grads
    rows = batch * h * t
    delta = _empty((rows,), np.float32)
    threads = rows * (d // 4)
    _kernels(d)[2](((threads + 255) // 256,), (256,), (
        out, grad, delta, dq, *strides(out), *strides(grad), *strides(dq), np.int32(h), np.int32(t),
        np.int32(rows)))
    _, bn, nt, *_ = tiles_of(CONFIG[d]["backward"])
    _kernels(d)[1](((s + bn - 1) // bn, batch * h), (nt,), (
        q, k, v, grad, lse, delta, dq, dk, dv, *(n for x in (q, k, v, grad, dq, dk, dv)
                                                for n in strides(x)),
        np.int32(h), np.int32(t), np.int32(s), np.float32(scale), np.int32(causal)),
        shared_mem=shared_bytes("backward", d))


SOURCE = source()


def fits(kind: str, d: int, tiles: tuple) -> bool:
    """Whether (BM, BN, NT[, blocks[, KX[, QB]]]) makes whole thread tiles at width d and fits
    shared memory: KX threads (8 or 16) across BN keys and NT/KX across BM rows, whole float
    pieces of O's HD/KX columns; backward, HD/4 threads across the columns and the rest across BN
    keys and BM rows, QB 1, 2 or 3, DL 1, 2 or 3 (2: warps of 16 keys × 64
    columns, NT/32 of them; 3: also of 16 query rows × 64 columns; the forward has none: 1)."""
    bm, bn, nt, _, kx, qb, dl = tiles_of(tiles)
    backward = kind == "backward"
    warps = lambda n: d % 64 == 0 and n % 16 == 0 and (n // 16) * (d // 64) == nt // 32  # noqa: E731
    whole = (kx in (8, 16) and nt % 32 == 0 and bn % kx == 0 and bm % (nt // kx) == 0
             and (d // kx) in (2, 4, 8, 16) and qb in ((1, 2, 3) if backward else (1,))
             and dl in ((1, 2, 3) if backward else (1,)) and (dl == 1 or warps(bn))
             and (dl < 3 or warps(bm)))
    if kind == "backward":
        across = nt // (d // 4)
        whole = whole and nt % (d // 4) == 0 and bn % across == 0 and bm % across == 0
    return whole and shared_bytes(kind, d, {d: {kind: tiles}}) <= SHARED_LIMIT

"""The float32 fused attention's backward on the tensor cores by 3xTF32 (issue 37, rounds 13-14):
attention_f32_grad.py's algorithm (FlashAttention-2's: δ and dQ's zeros by attention_f32's pass,
then one block per key tile keeping dK, dV in registers, dQ added by atomics), its five products
on mma.sync m16n8k8 tf32 with attention_f32_tc.py's split. attention.py takes it where TCB lists
the width.

A block of W warps owns BN = 8·W keys (K, V in shared memory), each pair of warps 16 of them, and
walks the query tiles of BM rows that see them (Q, dO, lse, δ into shared memory). Per tile a warp
computes half of Sᵀ = K Qᵀ's and dPᵀ = V dOᵀ's sums over d for its keys (the pair adds its halves;
m = key: the accumulators of Pᵀ and dSᵀ hold queries 2t, 2t + 1 of each 8, which dV += Pᵀ dO and
dK += dSᵀ Q take as their k = t, t + 4, dO's and Q's rows read to match: no shuffle), each its
half of dV's and dK's columns, then writes dSᵀ's big and small parts (split once, for dK's product)
to shared memory; after a barrier each warp takes HD/W columns of dQ += dS K over all BN keys (keys
2t, 2t + 1 again as k = t, t + 4: a float4 of big, small, big, small) and adds them by float2
atomics. Pitches: Q, dO, K, V HD + 4 (≡ 4 mod 32: rows g and columns t, or rows 2t and columns g,
in 32 banks), dS 2·BN + 16 (float4s of rows g in 32 banks).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from . import attention_f32, attention_f32_tc
from .attention_f32 import KERNELS as F32_KERNELS
from .attention_f32_grad import GRAD_KERNELS
from .common import HEADER, _empty, kernel, strides

# Per width: (W warps (8·W keys a block), BM query rows a tile): the fastest on the H200 (round 14,
# results/round14/f32/: within 3.4e-6 of float64), from FROM's T on, where it beat the FFMA
# backward at that T and every longer one. The records' tuples are (W, BM, PF, DS): PF 1 (the next
# query tile in a second buffer) and DS 1 (a warp a 16 keys, round 13's), measured slower, were
# deleted. Call 1: D 64 (8, 32, 0, 2) 1.682 / 2.990 /
# 5.678 / 10.826 ms at T 512 … 4,096 against FFMA's 1.658 / 3.020 / 5.665 / 11.101 (round 13's
# (4, 32, 1, 1) 1.841 … 10.834); D 128 (8, 16, 0, 2) 3.229 / 5.785 / 10.715 / 20.573 against
# 3.248 / 5.732 / 10.826 / 20.728 ((8, 16, 1, 1) 3.513 … 20.861, (16, 16, 0, 2) 3.936 … 23.431).
# Call 2 (call2/), the split by integer ops and dS split once: D 64 (8, 32, 0, 2) 1.372 / 2.430 /
# 4.523 / 8.680 against FFMA's 1.675 / 3.027 / 5.684 / 11.000, so from every T; D 128 from T 2,048
# as call 1 chose (call 2's D 128 timings were lost to a fault of the script, its rows ran).
TCB: dict[int, tuple[int, int]] = {64: (8, 32), 128: (8, 16)}
# Per width, the query length T from which TCB's backward runs (the FFMA backward below it).
FROM: dict[int, int] = {64: 0, 128: 2048}

KERNELS = r"""
// Q, dO, lse, δ of the query tile from row i0 into one buffer (lse in base 2; rows past T: p = 0
// by lse = +∞, δ = 0), Q and dO by cp.async (the caller commits).
template <int HD, int BM, int PS, int NTH> __device__ __forceinline__ void query_tile(
        float* qs, float* gs, float* lt, float* dt, const float* q, const float* g, Strides sq,
        Strides sg, const float* lrow, const float* drow, int b, int h, int i0, int T) {
    tile_async<HD, BM, PS, NTH>(qs, q, sq, b, h, i0, T - 1);
    tile_async<HD, BM, PS, NTH>(gs, g, sg, b, h, i0, T - 1);
    for (int r = threadIdx.x; r < BM; r += NTH) {
        int qi = i0 + r;
        lt[r] = qi < T ? lrow[qi] * LOG2E : POS_INF;
        dt[r] = qi < T ? drow[qi] : 0.f;
    }
}
// Two warps share 16 keys (round 14), each HD/2 columns of dK, dV and half of Sᵀ's and dPᵀ's sum
// over d, the halves added through shared memory (xs: the same sum in both warps, a + b = b + a):
// half the registers a thread of one warp owning its keys' columns whole (round 13's), two blocks
// of 8 warps an SM. The query tile is loaded and waited for at each tile (round 13's next tile in
// a second buffer meanwhile, and its one warp a 16 keys, measured slower: results/round14/f32/).
template <int HD, int W, int BM> __device__ __forceinline__ void tc_bwd(GRAD_ARGS) {
    enum { KW = W / 2, BN = 16 * KW, NTH = 32 * W, NQ = BM / 8, KS = HD / 16, PS = HD + 4,
           PDS = 2 * BN + 16, QC = HD / (8 * W), MQ = BM / 16 };
    extern __shared__ __align__(16) float smem[];
    float *ks = smem, *vs = ks + BN * PS, *qs = vs + BN * PS, *gs = qs + BM * PS,
          *dss = gs + BM * PS, *lt = dss + BM * PDS, *dt = lt + BM,
          *xs = dt + BM;  // each warp's halves of Sᵀ, dPᵀ (W · BM · 32 floats)
    S_(sq); S_(sk); S_(sv); S_(sg); S_(sdq); S_(sdk); S_(sdv);
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int gi = lane / 4, ti = threadIdx.x % 4, j0 = blockIdx.x * BN, kw = 16 * (warp % KW);
    int d0 = HD / 2 * (warp / KW);  // this warp's columns of dK, dV (and of d in Sᵀ, dPᵀ)
    int first = causal ? (j0 / BM) * BM : 0, c0 = HD / W * warp;  // c0: this warp's dQ columns
    const float *lrow = lse + (long long)bh * T, *drow = delta + (long long)bh * T;
    tile_async<HD, BN, PS, NTH>(ks, k, sk, b, h, j0, S - 1);
    tile_async<HD, BN, PS, NTH>(vs, v, sv, b, h, j0, S - 1);
    cp_commit();
    float c = scale * LOG2E, ak[KS][4], av[KS][4];
#pragma unroll
    for (int i = 0; i < KS; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) ak[i][e] = av[i][e] = 0.f;
    for (int i0 = first; i0 < T; i0 += BM) {
        __syncthreads();  // the last tile's readers of Q, dO, dS are done
        query_tile<HD, BM, PS, NTH>(qs, gs, lt, dt, q, g, sq, sg, lrow, drow, b, h, i0, T);
        cp_commit();
        cp_wait<0>();
        __syncthreads();
        float st[NQ][4], dpt[NQ][4];  // Sᵀ, dPᵀ: keys kw + gi (+ 8), queries 8n + 2ti (+ 1)
#pragma unroll
        for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.f;
#pragma unroll
        for (int s8 = 0; s8 < KS; ++s8) {  // k = d: columns d0 + 8·s8 + ti, + 4
            const float *kr = ks + (kw + gi) * PS + d0 + 8 * s8 + ti;
            const float *vr = vs + (kw + gi) * PS + d0 + 8 * s8 + ti;
            float ka[4] = {kr[0], kr[8 * PS], kr[4], kr[8 * PS + 4]};
            float va[4] = {vr[0], vr[8 * PS], vr[4], vr[8 * PS + 4]};
            unsigned kab[4], kas[4], vab[4], vas[4];
            split4(ka, kab, kas);
            split4(va, vab, vas);
#pragma unroll
            for (int n = 0; n < NQ; ++n) {
                const float *qr = qs + (8 * n + gi) * PS + d0 + 8 * s8 + ti;
                const float *gr = gs + (8 * n + gi) * PS + d0 + 8 * s8 + ti;
                unsigned qb[2], qsm[2], gb[2], gsm[2];
                split(qr[0], qb[0], qsm[0]);
                split(qr[4], qb[1], qsm[1]);
                split(gr[0], gb[0], gsm[0]);
                split(gr[4], gb[1], gsm[1]);
                mma3(st[n], kab, kas, qb, qsm);
                mma3(dpt[n], vab, vas, gb, gsm);
            }
        }
        {  // the other half's sums (warp ± KW): both warps hold the same Sᵀ, dPᵀ
            float* mine = xs + warp * BM * 32 + lane;
            const float* theirs = xs + (warp < KW ? warp + KW : warp - KW) * BM * 32 + lane;
#pragma unroll
            for (int n = 0; n < NQ; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    mine[(8 * n + e) * 32] = st[n][e];
                    mine[(8 * n + 4 + e) * 32] = dpt[n][e];
                }
            __syncthreads();
#pragma unroll
            for (int n = 0; n < NQ; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    st[n][e] += theirs[(8 * n + e) * 32];
                    dpt[n][e] += theirs[(8 * n + 4 + e) * 32];
                }
        }
#pragma unroll
        for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {  // Pᵀ and dSᵀ = Pᵀ ⊙ (dPᵀ − δ), dSᵀ into dS's rows
                int r = 8 * n + 2 * ti + (e & 1), kl = kw + gi + 8 * (e >> 1), key = j0 + kl;
                bool zero = key >= S || i0 + r >= T || (causal && key > i0 + r);
                float p = zero ? 0.f : exp2f(st[n][e] * c - lt[r]);
                st[n][e] = p;
                dpt[n][e] = p * (dpt[n][e] - dt[r]);
            }
#pragma unroll
        for (int n = 0; n < NQ; ++n) {  // dV += Pᵀ dO, dK += dSᵀ Q over queries 8n … 8n + 7
            float pa[4] = {st[n][0], st[n][2], st[n][1], st[n][3]};  // k = t: query 2t; t + 4: 2t + 1
            float sa[4] = {dpt[n][0], dpt[n][2], dpt[n][1], dpt[n][3]};
            unsigned pb[4], psm[4], sb[4], ssm[4];
            split4(pa, pb, psm);
            split4(sa, sb, ssm);
            if (warp < KW) {  // dSᵀ's parts into dS's rows, split once for dQ's product
                int r0 = 8 * n + 2 * ti, kl0 = kw + gi;
#pragma unroll
                for (int e = 0; e < 4; ++e)  // e: query r0 + (e >> 1), key kl0 + 8 (e & 1)
                    *(float2*)(dss + (r0 + (e >> 1)) * PDS + 2 * (kl0 + 8 * (e & 1))) =
                        make_float2(__uint_as_float(sb[e]), __uint_as_float(ssm[e]));
            }
            const float *g0 = gs + (8 * n + 2 * ti) * PS + d0 + gi;
            const float *q0 = qs + (8 * n + 2 * ti) * PS + d0 + gi;
#pragma unroll
            for (int nd = 0; nd < KS; ++nd) {
                unsigned ob[2], osm[2], qb[2], qsm[2];
                split(g0[8 * nd], ob[0], osm[0]);
                split(g0[PS + 8 * nd], ob[1], osm[1]);
                split(q0[8 * nd], qb[0], qsm[0]);
                split(q0[PS + 8 * nd], qb[1], qsm[1]);
                mma3(av[nd], pb, psm, ob, osm);
                mma3(ak[nd], sb, ssm, qb, qsm);
            }
        }
        __syncthreads();  // dS whole
        float aq[MQ][QC][4];
#pragma unroll
        for (int m = 0; m < MQ; ++m)
#pragma unroll
            for (int nc = 0; nc < QC; ++nc)
#pragma unroll
                for (int e = 0; e < 4; ++e) aq[m][nc][e] = 0.f;
#pragma unroll 4
        for (int s8 = 0; s8 < BN / 8; ++s8) {  // k = key: keys 8·s8 + 2ti, + 1
            unsigned ab[MQ][4], as[MQ][4];
#pragma unroll
            for (int m = 0; m < MQ; ++m) {
                float4 lo = *(const float4*)(dss + (16 * m + gi) * PDS + 2 * (8 * s8 + 2 * ti));
                float4 hi = *(const float4*)(dss + (16 * m + gi + 8) * PDS + 2 * (8 * s8 + 2 * ti));
                ab[m][0] = __float_as_uint(lo.x); ab[m][1] = __float_as_uint(hi.x);
                ab[m][2] = __float_as_uint(lo.z); ab[m][3] = __float_as_uint(hi.z);
                as[m][0] = __float_as_uint(lo.y); as[m][1] = __float_as_uint(hi.y);
                as[m][2] = __float_as_uint(lo.w); as[m][3] = __float_as_uint(hi.w);
            }
            const float* k0 = ks + (8 * s8 + 2 * ti) * PS + c0 + gi;
#pragma unroll
            for (int nc = 0; nc < QC; ++nc) {
                unsigned kb2[2], ks2[2];
                split(k0[8 * nc], kb2[0], ks2[0]);
                split(k0[PS + 8 * nc], kb2[1], ks2[1]);
#pragma unroll
                for (int m = 0; m < MQ; ++m) mma3(aq[m][nc], ab[m], as[m], kb2, ks2);
            }
        }
#pragma unroll
        for (int m = 0; m < MQ; ++m)
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                int row = i0 + 16 * m + gi + 8 * x;
                if (row >= T) continue;
                float* out = atw(dq, sdq, b, h, row) + c0 + 2 * ti;
#pragma unroll
                for (int nc = 0; nc < QC; ++nc)
                    atomicAdd((float2*)(out + 8 * nc), make_float2(aq[m][nc][2 * x] * scale,
                                                                   aq[m][nc][2 * x + 1] * scale));
            }
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int key = j0 + kw + gi + 8 * x;
        if (key >= S) continue;
        float *kp = atw(dk, sdk, b, h, key) + d0 + 2 * ti, *vp = atw(dv, sdv, b, h, key) + d0 + 2 * ti;
#pragma unroll
        for (int nd = 0; nd < KS; ++nd) {
            *(float2*)(kp + 8 * nd) = make_float2(ak[nd][2 * x] * scale, ak[nd][2 * x + 1] * scale);
            *(float2*)(vp + 8 * nd) = make_float2(av[nd][2 * x], av[nd][2 * x + 1]);
        }
    }
}
"""


def takes(d: int, t: int) -> bool:
    """Whether a backward at width d and query length t runs here (TCB's widths from FROM's T)."""
    return d in TCB and t >= FROM.get(d, 0)


def keys(tiles: tuple) -> int:
    """BN, the keys a block of these tiles owns: 16 a pair of warps."""
    return 8 * tiles[0]


def shared_bytes(d: int, tiles: tuple) -> int:
    """K, V (BN rows), Q, dO (BM rows), all of pitch d + 4; dS's big and small parts
    (BM × (2·BN + 16)); lse, δ; the halves of Sᵀ, dPᵀ (W · BM · 32)."""
    w, bm = tiles
    bn = keys(tiles)
    return 4 * ((2 * bn + 2 * bm) * (d + 4) + bm * (2 * bn + 16) + 2 * bm + w * bm * 32)


def source(tcb: dict | None = None) -> str:
    """The CUDA source: per width d of `tcb` (TCB's shape, TCB itself by default), the kernel
    f32tc_backward_<d>."""
    return _source(tuple(sorted((tcb if tcb is not None else TCB).items())))


@cache
def _source(tcb: tuple) -> str:
    out = [HEADER, F32_KERNELS, GRAD_KERNELS, attention_f32_tc.KERNELS, KERNELS]
    for d, (w, bm) in tcb:  # 16 warps an SM (the registers capped to fit them)
        bounds = f"{32 * w}, {max(1, 16 // w)}"
        out.append(f'extern "C" __global__ void __launch_bounds__({bounds}) f32tc_backward_{d}'
                   f"(GRAD_ARGS) {{ tc_bwd<{d}, {w}, {bm}>(q, k, v, g, lse, delta, dq, dk, "
                   "dv, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sgb, sgh, sgt, sdqb, sdqh, "
                   "sdqt, sdkb, sdkh, sdkt, sdvb, sdvh, sdvt, heads, T, S, scale, causal); }\n")
    return "".join(out)


SOURCE = source()  # a bench may set TCB and SOURCE = source(...) together
_LOADED: dict[tuple[str, int], Any] = {}  # (SOURCE, width) -> its kernel


def _kernel(d: int) -> Any:
    """f32tc_backward_<d> from SOURCE, allowed the dynamic shared memory it takes."""
    key = (SOURCE, d)
    if key not in _LOADED:
        fn = {64: lambda: kernel(SOURCE, "f32tc_backward_64"),
              128: lambda: kernel(SOURCE, "f32tc_backward_128")}[d]()
        fn.max_dynamic_shared_size_bytes = shared_bytes(d, TCB[d])
        _LOADED[key] = fn
    return _LOADED[key]


def backward(q: Any, k: Any, v: Any, grad: Any, out: Any, lse: Any, grads: tuple,
             heads: tuple[int, int], scale: float, causal: bool) -> None:
    """dQ, dK, dV into `grads` (float32): δ and dQ's zeros (attention_f32's pass), then the key
    tiles' pass on the tensor cores."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    dq, dk, dv = grads
    rows = batch * h * t
    delta = _empty((rows,), np.float32)
    threads = rows * (d // 4)
    attention_f32._kernels(d)[2](((threads + 255) // 256,), (256,), (
        out, grad, delta, dq, *strides(out), *strides(grad), *strides(dq), np.int32(h), np.int32(t),
        np.int32(rows)))
    w, bn = TCB[d][0], keys(TCB[d])
    _kernel(d)(((s + bn - 1) // bn, batch * h), (32 * w,), (
        q, k, v, grad, lse, delta, dq, dk, dv, *(n for x in (q, k, v, grad, dq, dk, dv)
                                                for n in strides(x)),
        np.int32(h), np.int32(t), np.int32(s), np.float32(scale), np.int32(causal)),
        shared_mem=shared_bytes(d, TCB[d]))

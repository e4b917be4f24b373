"""The float32 fused attention's forward on the tensor cores by 3xTF32 (issue 37): the same
algorithm as attention_f32.py's FFMA forward (the online softmax over key tiles, float32 running
max, row sum and accumulators), its two products Q Kᵀ and P V on mma.sync m16n8k8 tf32.

3xTF32 (CUTLASS's OpMultiplyAddFastF32, which PyTorch's float32 SDPA runs): each float32 operand x
is split into big = x rounded to TF32 (10 mantissa bits) and small = x − big rounded too, and
a·b ≈ a_big·b_big + a_big·b_small + a_small·b_big (a_small·b_small, ~2⁻²² of a·b, left out), in
float32 accumulators: about float32's accuracy (results/round13/f32/: the float32 tests' bound
1e-5 holds) at three tensor-core products each. attention.py takes it where TC lists the width.

Layout: a block of W warps owns 16·W query rows, each warp 16 of them (Q scaled by scale·log2e in
registers, split at each use); key and value tiles of N rows by cp.async into a stage, split by
the block once into fragment-ordered big and small parts (round 13's second kernel: a split per
warp, in registers, made D 128's forward 16 % slower). The head width of Q Kᵀ is summed in an
order of our choosing (any permutation of the d's gives the same sum), so a thread's float4 of Q
or K at columns 16c + 4t … + 3 is its A or B fragment of two k-steps (k = t, t + 4 of step 2c,
then of 2c + 1). S's accumulator holds keys 2t, 2t + 1 of each 8; P V's k-step takes them as its
k = t, t + 4, V's fragments split in that order, so P goes from the accumulators to the A
fragments with no shuffle and no shared memory.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .attention_f32 import KERNELS as F32_KERNELS
from .common import HEADER, kernel, strides

# Per width: (W warps a block (16·W query rows), N keys a tile, blocks an SM must hold:
# __launch_bounds__' second number, 0 none, QH: 1 Q's split held in registers across the key tiles
# (the compiler hoists it), 0 split again at each tile (D 128: held, it spills). Widths not here
# take attention_f32.py's FFMA forward.
# The fastest at every T 512 … 4,096 of 4 per width on the H200 (results/round13/f32/call3/):
# D 64's forward with 8 warps 0.52 / 0.92 / 1.68 / 3.24 ms against the FFMA forward's 0.64 / 1.15 /
# 2.15 / 4.15, D 128's 0.95 / 1.68 / 3.13 / 6.00 against 1.22 / 2.22 / 4.23 / 8.18 (PyTorch's float32
# SDPA forward: 1.01 / 1.76 / 3.25 / 6.16). Q held split (QH 1) at D 128 spills: 8.07 at T 4,096.
# Round 14's call 2 (results/round14/f32/call2/), the split by integer ops: D 64's (8, 32, 0, 1)
# 0.72 / 1.25 / 2.31 / 4.35 ms, slower than the FFMA forward (0.66 / 1.15 / 2.16 / 4.15; 0.52 …
# 3.30 with cvt.rna in call 1): ptxas gives it 172 registers (245 before) and issues Q Kᵀ's
# products two chains at a time with NOPs between (nvdisasm), why is not known yet (holding Q's
# split by a volatile split4_here did not change it). D 64 takes the FFMA forward meanwhile; D 128's
# forward went the other way (the bench's fwd + bwd below FROM's T: 4.02 / 7.20 ms at T 512 /
# 1,024 against 4.11 / 7.35 in call 1, the FFMA backward alike).
TC = {128: (8, 32, 0, 0)}

# The device instructions (benchmarks/emulate_f32_tc.py puts CPU stand-ins in their place):
# the split, Q's split where it may not be hoisted, one TF32 product. The rounding to TF32 is
# cvt.rna.tf32.f32's (to nearest, ties away from zero: half a TF32 ulp added to the bits, the low
# 13 cut) by an integer add and a mask: ptxas makes each cvt.rna four instructions and a predicate
# (a compare and select keep NaN), and the splits were most of the kernels' instructions (round 14).
DEVICE = r"""
__device__ __forceinline__ unsigned rna(float x) {  // finite x: cvt.rna.tf32.f32's bits
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}
__device__ __forceinline__ void split(float x, unsigned& big, unsigned& small) {
    big = rna(x);
    small = rna(x - __uint_as_float(big));
}
__device__ __forceinline__ void mma_tf32(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// split4 (below) where the compiler may not hoist it out of a loop (the add volatile): Q's split at
// each key tile, not 2·HD/4 registers a thread held across them.
__device__ __forceinline__ void split4_here(const float* x, unsigned* big, unsigned* small) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        unsigned u;
        asm volatile("add.u32 %0, %1, 4096;" : "=r"(u) : "r"(__float_as_uint(x[e])));
        big[e] = u & 0xffffe000u;
        small[e] = rna(x[e] - __uint_as_float(big[e]));
    }
}
"""

KERNELS = DEVICE + r"""
// c += a·b by 3xTF32: the two small terms first (CUTLASS's order), the big product last.
__device__ __forceinline__ void mma3(float* c, const unsigned* ab, const unsigned* as,
                                     const unsigned* bb, const unsigned* bs) {
    mma_tf32(c, as, bb[0], bb[1]);
    mma_tf32(c, ab, bs[0], bs[1]);
    mma_tf32(c, ab, bb[0], bb[1]);
}
__device__ __forceinline__ void split4(const float* x, unsigned* big, unsigned* small) {
#pragma unroll
    for (int e = 0; e < 4; ++e) split(x[e], big[e], small[e]);
}
__device__ __forceinline__ float qmax(float x) {  // over the 4 threads of a row (same g)
    x = fmaxf(x, __shfl_xor_sync(FULL, x, 1));
    return fmaxf(x, __shfl_xor_sync(FULL, x, 2));
}
__device__ __forceinline__ float qsum(float x) {
    x += __shfl_xor_sync(FULL, x, 1);
    return x + __shfl_xor_sync(FULL, x, 2);
}

// Thread (g, t) = (lane / 4, lane % 4) of warp w holds rows w0 + g and w0 + g + 8. A key tile
// lands raw (cp.async, pitch HD + 4) in a stage; the block then splits it once into fragment
// order: kb, ksm[(i·KC + cc)·32 + lane], a float4 of K's big (small) parts, the B fragments of
// k-steps 2cc, 2cc + 1 for keys 8i … 8i + 7; vf[(i·DT + nt)·32 + lane] the float4 (b0, b1 big,
// b0, b1 small) of P V's B fragment (keys 8i + 2t, 8i + 2t + 1; column 8nt + g). Every load of
// the products is then one conflict-free 128-bit load and no split (each value split once a
// block, not once a warp); the next tile lands in the stage while the warps multiply.
template <int HD, int W, int N, int QH> __device__ __forceinline__ void tc_fwd(FORWARD_ARGS) {
    enum { M = 16 * W, NTH = 32 * W, NT = N / 8, DT = HD / 8, KC = HD / 16, PS = HD + 4 };
    extern __shared__ __align__(16) float smem[];
    float *kst = smem, *vst = kst + N * PS;
    float4 *kb = (float4*)(vst + N * PS), *ksm = kb + NT * KC * 32, *vf = ksm + NT * KC * 32;
    S_(sq); S_(sk); S_(sv); S_(so);
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, lane = threadIdx.x % 32;
    int g = lane / 4, t = lane % 4, i0 = (gridDim.x - 1 - blockIdx.x) * M;  // longest rows first
    int w0 = i0 + 16 * (threadIdx.x / 32);
    int last = causal ? min(S, i0 + M) : S, tiles = (last + N - 1) / N;
    tile_async<HD, N, PS, NTH>(kst, k, sk, b, h, 0, S - 1);
    tile_async<HD, N, PS, NTH>(vst, v, sv, b, h, 0, S - 1);
    cp_commit();
    float c = scale * LOG2E, qr[2][KC][4];  // scores in base 2
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        const float* row = at(q, sq, b, h, min(w0 + g + 8 * x, T - 1));
#pragma unroll
        for (int cc = 0; cc < KC; ++cc) {
            float4 f = ((const float4*)row)[4 * cc + t];
            qr[x][cc][0] = f.x * c; qr[x][cc][1] = f.y * c; qr[x][cc][2] = f.z * c;
            qr[x][cc][3] = f.w * c;
        }
    }
    float acc[DT][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < DT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    for (int n = 0; n < tiles; ++n) {
        int j0 = n * N;
        cp_wait<0>();
        __syncthreads();  // tile n in the stage; every warp done with tile n - 1's fragments
        for (int x = threadIdx.x; x < NT * KC * 32; x += NTH) {  // K: (i, cc, lane) slots
            int ln = x % 32, i = x / 32 / KC, cc = x / 32 % KC;
            float kk[4];
            lds<4>(kk, kst + (8 * i + ln / 4) * PS + 16 * cc + 4 * (ln % 4));
            unsigned big[4], sml[4];
            split4(kk, big, sml);
            kb[x] = make_float4(__uint_as_float(big[0]), __uint_as_float(big[1]),
                                __uint_as_float(big[2]), __uint_as_float(big[3]));
            ksm[x] = make_float4(__uint_as_float(sml[0]), __uint_as_float(sml[1]),
                                 __uint_as_float(sml[2]), __uint_as_float(sml[3]));
        }
        for (int x = threadIdx.x; x < NT * DT * 32; x += NTH) {  // V: (i, nt, lane) slots
            int ln = x % 32, i = x / 32 / DT, nt = x / 32 % DT;
            const float* v0 = vst + (8 * i + 2 * (ln % 4)) * PS + 8 * nt + ln / 4;
            unsigned b0, s0, b1, s1;
            split(v0[0], b0, s0);
            split(v0[PS], b1, s1);
            vf[x] = make_float4(__uint_as_float(b0), __uint_as_float(b1), __uint_as_float(s0),
                                __uint_as_float(s1));
        }
        __syncthreads();  // the fragments written, the stage read
        if (n + 1 < tiles) {  // the next tile lands while this one is multiplied
            tile_async<HD, N, PS, NTH>(kst, k, sk, b, h, j0 + N, S - 1);
            tile_async<HD, N, PS, NTH>(vst, v, sv, b, h, j0 + N, S - 1);
            cp_commit();
        }
        if (!causal || j0 <= w0 + 15) {  // else no row of this warp sees these keys
            float s[NT][4];
#pragma unroll
            for (int i = 0; i < NT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
            for (int cc = 0; cc < KC; ++cc) {  // k-steps 2cc, 2cc + 1: columns 16cc … 16cc + 15
                float a0[4] = {qr[0][cc][0], qr[1][cc][0], qr[0][cc][1], qr[1][cc][1]};
                float a1[4] = {qr[0][cc][2], qr[1][cc][2], qr[0][cc][3], qr[1][cc][3]};
                unsigned ab0[4], as0[4], ab1[4], as1[4];
                if (QH) {
                    split4(a0, ab0, as0);
                    split4(a1, ab1, as1);
                } else {
                    split4_here(a0, ab0, as0);
                    split4_here(a1, ab1, as1);
                }
#pragma unroll
                for (int i = 0; i < NT; ++i) {
                    float4 fb = kb[(i * KC + cc) * 32 + lane], fs = ksm[(i * KC + cc) * 32 + lane];
                    unsigned bb0[2] = {__float_as_uint(fb.x), __float_as_uint(fb.y)};
                    unsigned bs0[2] = {__float_as_uint(fs.x), __float_as_uint(fs.y)};
                    unsigned bb1[2] = {__float_as_uint(fb.z), __float_as_uint(fb.w)};
                    unsigned bs1[2] = {__float_as_uint(fs.z), __float_as_uint(fs.w)};
                    mma3(s[i], ab0, as0, bb0, bs0);
                    mma3(s[i], ab1, as1, bb1, bs1);
                }
            }
            if (j0 + N > S || (causal && j0 + N - 1 > w0)) {  // the diagonal or the last keys
#pragma unroll
                for (int i = 0; i < NT; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        int key = j0 + 8 * i + 2 * t + (e & 1), row = w0 + g + 8 * (e >> 1);
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
                float mn = fmaxf(m[x], qmax(mx[x]));
                base[x] = mn == NEG_INF ? 0.f : mn;  // a row with no key yet: its p are all 0
                alpha[x] = exp2f(m[x] - base[x]);  // m = −∞ the first time: alpha = 0
                m[x] = mn;
                l[x] *= alpha[x];
            }
#pragma unroll
            for (int i = 0; i < NT; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[i][e] = exp2f(s[i][e] - base[e >> 1]);
                    l[e >> 1] += s[i][e];  // this thread's part of the row sum
                }
#pragma unroll
            for (int i = 0; i < DT; ++i) {
                acc[i][0] *= alpha[0]; acc[i][1] *= alpha[0];
                acc[i][2] *= alpha[1]; acc[i][3] *= alpha[1];
            }
#pragma unroll
            for (int i = 0; i < NT; ++i) {  // O += P V over keys 8i … 8i + 7
                float pa[4] = {s[i][0], s[i][2], s[i][1], s[i][3]};  // k = t: key 2t; t + 4: 2t + 1
                unsigned pb[4], ps[4];
                split4(pa, pb, ps);
#pragma unroll
                for (int nt = 0; nt < DT; ++nt) {
                    float4 f = vf[(i * DT + nt) * 32 + lane];
                    unsigned vb[2] = {__float_as_uint(f.x), __float_as_uint(f.y)};
                    unsigned vsm[2] = {__float_as_uint(f.z), __float_as_uint(f.w)};
                    mma3(acc[nt], pb, ps, vb, vsm);
                }
            }
        }
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int row = w0 + g + 8 * x;
        float sum = qsum(l[x]);
        if (row >= T) continue;
        float inv = 1.f / sum, *op = atw(o, so, b, h, row);
#pragma unroll
        for (int i = 0; i < DT; ++i)
            *(float2*)(op + 8 * i + 2 * t) = make_float2(acc[i][2 * x] * inv, acc[i][2 * x + 1] * inv);
        if (t == 0) lse[(long long)bh * T + row] = (m[x] + log2f(sum)) * LN2;
    }
}
"""


def source(tc: dict | None = None) -> str:
    """The CUDA source: per width d of `tc` (TC's shape; a bench's variants, one width or more),
    the kernel f32tc_forward_<d>."""
    return _source(tuple(sorted((tc if tc is not None else TC).items())))


@cache
def _source(tc: tuple) -> str:
    out = [HEADER, F32_KERNELS, KERNELS]
    for d, (w, n, least, qh) in tc:
        bounds = f"{32 * w}, {least}" if least else f"{32 * w}"
        out.append(f'extern "C" __global__ void __launch_bounds__({bounds}) f32tc_forward_{d}'
                   f"(FORWARD_ARGS) {{ tc_fwd<{d}, {w}, {n}, {qh}>(q, k, v, o, lse, sqb, sqh, sqt, "
                   "skb, skh, skt, svb, svh, svt, sob, soh, sot, heads, T, S, scale, causal); }\n")
    return "".join(out)


SOURCE = source()  # a bench may set TC and SOURCE = source(...) together
_LOADED: dict[tuple[str, int], Any] = {}  # (SOURCE, width) -> its kernel


def shared_bytes(d: int) -> int:
    """The stage (a K and a V tile, pitch d + 4) and K's and V's split fragments."""
    _, n, *_ = TC[d]
    return 4 * (2 * n * (d + 4) + 4 * n * d)


def _kernel(d: int) -> Any:
    """f32tc_forward_<d> from SOURCE, allowed the dynamic shared memory it takes."""
    key = (SOURCE, d)
    if key not in _LOADED:
        # TC's widths only (D 64's forward is FFMA since round 14; a width added back to TC
        # comes back here too: tests/test_kernel_room.py checks each name against SOURCE)
        fn = {128: lambda: kernel(SOURCE, "f32tc_forward_128")}[d]()
        fn.max_dynamic_shared_size_bytes = shared_bytes(d)
        _LOADED[key] = fn
    return _LOADED[key]


def forward(q: Any, k: Any, v: Any, out: Any, lse: Any, heads: tuple[int, int], scale: float,
            causal: bool) -> None:
    """O and lse into `out`, `lse` from q, k, v (float32, rows 16-byte aligned: attention._fits)."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    w, *_ = TC[d]
    m = 16 * w
    _kernel(d)(((t + m - 1) // m, batch * h), (32 * w,), (
        q, k, v, out, lse, *strides(q), *strides(k), *strides(v), *strides(out), np.int32(h),
        np.int32(t), np.int32(s), np.float32(scale), np.int32(causal)),
        shared_mem=shared_bytes(d))

"""What the second tensor-core attention's kernels share (CUDA text; attention_mma.py puts it
before its kernels): mma.sync m16n8k16, fragments read by ldmatrix (.trans for a tile read
transposed), cp.async tile copies, the products of a warp's 16 rows, and the rows-only convert.
Tiles in shared memory have rows padded by 8 numbers, so ldmatrix's 8 rows fall in 32 banks.
"""

import numpy as np

WIDTHS = (16, 32, 64, 128)  # head widths (a multiple of the product's k = 16)
FORMATS = ("bf16", "fp16")
U16 = np.dtype(np.uint16)  # a bf16 or fp16 number's bits (CuPy has no bf16 dtype)


def padded(n: int) -> int:
    """Rows the 16-bit row copies hold: n rounded up to 128, so that every walked tile (32, 64 or
    128 rows, from a multiple of its size) is whole: the rows past n are zeros, never another
    head's numbers or memory past the array."""
    return (n + 127) // 128 * 128


# The defines, rounding and product the kernels use.
PRELUDE = r"""
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
}"""

TILES = PRELUDE + r"""
__device__ __forceinline__ unsigned sm(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(void* dst, const void* src) {  // global -> shared, async
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sm(dst)), "l"(src));
}
// The same with src_bytes of the 16 read (0: the 16 bytes are zeros, nothing read): rows past the end.
__device__ __forceinline__ void cp16z(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(sm(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
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
// The same with A's KC fragments already in registers (a block's own rows, read once: KR, QR).
template <int F16, int KC, int NT, int P> __device__ __forceinline__ void mma_fbt(
        float (*c)[4], const unsigned (*a)[4], const half_t* b) {
#pragma unroll
    for (int kc = 0; kc < KC; ++kc)
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned w[4];
            frag_b(w, b, P, np * 16, kc * 16);
            mma<F16>(c[2 * np], a[kc], w[0], w[1]);
            mma<F16>(c[2 * np + 1], a[kc], w[2], w[3]);
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
// tile; zeros past T. keep (not null: the head's (Tp, HD) 16-bit rows in global memory): the
// rows before `lim` stored there too (the forward keeps Q's rows for the backward: no convert).
template <int F16, int HD, int NTH> __device__ __forceinline__ void own_rows(
        half_t* dst, const float* x, Strides s, int b, int h, int first, int n, int T,
        half_t* keep = nullptr, int lim = 0) {
    for (int i = threadIdx.x; i < n * (HD / 4); i += NTH) {
        int j = i / (HD / 4), c = (i % (HD / 4)) * 4;
        float4 v = first + j < T ? *(const float4*)(row_at(x, s, b, h, first + j) + c)
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
        uint2 r = make_uint2(pack<F16>(v.x, v.y), pack<F16>(v.z, v.w));
        *(uint2*)(dst + j * (HD + 8) + c) = r;
        if (keep && first + j < lim) *(uint2*)(keep + (long long)(first + j) * HD + c) = r;
    }
}
// Staged tiles (round 8): n rows from row `first` of x (float32, strided) into a [n][HD] float32
// tile, async; rows at or past `last` are zeros. stage_round then rounds it into a [n][HD + 8]
// 16-bit tile in shared memory: the kernel reads the float32 tensor itself, no convert launch.
template <int HD, int NTH> __device__ __forceinline__ void stage_async(
        float* dst, const float* x, Strides s, int b, int h, int first, int n, int last) {
#pragma unroll 4
    for (int i = threadIdx.x; i < n * (HD / 4); i += NTH) {
        int j = i / (HD / 4), c = (i % (HD / 4)) * 4, row = first + j;
        cp16z(dst + j * HD + c, row_at(x, s, b, h, min(row, last - 1)) + c, row < last ? 16 : 0);
    }
}
template <int F16, int HD, int NTH> __device__ __forceinline__ void stage_round(
        half_t* dst, const float* src, int n) {
#pragma unroll 4
    for (int i = threadIdx.x; i < n * (HD / 4); i += NTH) {  // 4 numbers a thread: no bank conflict
        int j = i / (HD / 4), c = (i % (HD / 4)) * 4;
        float4 v = *(const float4*)(src + j * HD + c);
        *(uint2*)(dst + j * (HD + 8) + c) = make_uint2(pack<F16>(v.x, v.y), pack<F16>(v.z, v.w));
    }
}
// A 16-bit copy of two neighbouring float32 outputs at x's offset in it (h null: no copy wanted).
// COPIES (defined by attention_mma.source per module): 0 compiles every copy store out, for the
// passes no 16-bit product reads (round 9: the kernels are then round 7's code, no copy tail).
template <int F16> __device__ __forceinline__ void put_pair(half_t* h, const float* at, const float* x,
                                                           float lo, float hi) {
    if (COPIES && h) *(unsigned*)(h + (at - x)) = pack<F16>(lo, hi);
}
// 2^x by the special-function unit, subnormal results flushed to 0 (exp2f adds their handling:
// instructions on every score, for values the bf16/fp16 products would not keep apart from 0).
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
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
// With o (dO's convert): also δ = rowsum(x ⊙ o) into delta, the HD / 8 threads of a row summing
// over shuffles (a row's threads are neighbours in one warp). With zero (Q's convert, dQ added by
// atomics): zeros into that array of x's shape. Grid (Tp·HD / 8 / 256 rounded up, B·H). SW (HD
// 64): row r's 16-byte chunk c stored at chunk c ^ (r % 8), 128-byte swizzle's layout of any tile of
// 8k rows (mma_forward_wgq's K, V: a tile copied as it stands is what wgmma's descriptors read).
#define MMA_CONVERT_ARGS const float* x, STRIDES(sx), half_t* out, int heads, int T, int Tp, \
        const float* o, STRIDES(so), float* delta, float* zero, STRIDES(sz)
template <int F16, int HD, int SW = 0> __device__ __forceinline__ void to_rows(MMA_CONVERT_ARGS) {
    S_(sx); S_(so); S_(sz);
    int i = blockIdx.x * blockDim.x + threadIdx.x, bh = blockIdx.y;
    if (i >= Tp * (HD / 8)) return;  // whole warps: Tp·HD / 8 is a multiple of 128
    int row = i / (HD / 8), c = (i % (HD / 8)) * 8, b = bh / heads, h = bh % heads;
    uint4 r = make_uint4(0u, 0u, 0u, 0u);
    float dot = 0.f;
    if (row < T) {
        const float* p = row_at(x, sx, b, h, row) + c;
        float4 a = *(const float4*)p, e = *(const float4*)(p + 4);
        r = make_uint4(pack<F16>(a.x, a.y), pack<F16>(a.z, a.w), pack<F16>(e.x, e.y), pack<F16>(e.z, e.w));
        if (o) {
            const float* po = row_at(o, so, b, h, row) + c;
            float4 oa = *(const float4*)po, oe = *(const float4*)(po + 4);
            dot = a.x * oa.x + a.y * oa.y + a.z * oa.z + a.w * oa.w
                + e.x * oe.x + e.y * oe.y + e.z * oe.z + e.w * oe.w;
        }
        if (zero) {
            float4* pz = (float4*)(row_at(zero, sz, b, h, row) + c);
            pz[0] = pz[1] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    *(uint4*)(out + ((long long)bh * Tp + row) * HD + (SW ? ((c >> 3) ^ (row & 7)) << 3 : c)) = r;
    if (o) {
#pragma unroll
        for (int off = 1; off < HD / 8; off <<= 1) dot += __shfl_xor_sync(FULL, dot, off);
        if (c == 0 && row < T) delta[(long long)bh * T + row] = dot;
    }
}

"""

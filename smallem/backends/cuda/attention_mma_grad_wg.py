"""The tensor-core attention's key kernel on Hopper's warpgroup products (CUDA text, round 11, issue
37; attention_mma.py compiles it as keyq where CONFIG["key_wg"] asks and the modules are sm_90a's):
dK, dV and dQ by atomics as attention_mma_grad.py's mma_key, its five products over a key block by
wgmma.mma_async, every operand from shared memory, one warpgroup of 64 keys a block.
"""


def _wgmma_ss(f16: int, ta: int, tb: int) -> str:
    """The CUDA function wgmma_ss_<f16><ta><tb>: D (64 x 64, float32, 32 registers a thread) = A
    (64 x 16) · B (16 x 64) + D where `add`, else + 0, both from shared-memory descriptors; ta, tb
    1: MN-major (transposed: A's rows, B's columns along the tile's contiguous dimension), else
    K-major."""
    kind = "f16" if f16 else "bf16"
    d = ", ".join(f"%{i}" for i in range(32))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(32))
    return (f"__device__ __forceinline__ void wgmma_ss_{f16}{ta}{tb}(float* d, unsigned long long adesc, "
            f"unsigned long long bdesc, int add) {{\n"
            f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %34, 0;\\n"\n'
            f'                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.{kind}.{kind} "\n'
            f'                 "{{{d}}}, %32, %33, p, 1, 1, {ta}, {tb};\\n}}\\n"\n'
            f"                 : {outs}\n"
            f'                 : "l"(adesc), "l"(bdesc), "r"(add));\n}}\n')


KERNELS_BACKWARD_WG = r"""
#if WG_OK
""" + "".join(_wgmma_ss(f, ta, tb) for f in (0, 1) for ta, tb in ((0, 0), (0, 1), (1, 1))) + r"""
#endif
template <int F16, int TA, int TB> __device__ __forceinline__ void wgmma_ss(
        float* d, unsigned long long adesc, unsigned long long bdesc, int add) {
#if WG_OK
    if (F16 && TA) wgmma_ss_111(d, adesc, bdesc, add);
    else if (F16 && TB) wgmma_ss_101(d, adesc, bdesc, add);
    else if (F16) wgmma_ss_100(d, adesc, bdesc, add);
    else if (TA) wgmma_ss_011(d, adesc, bdesc, add);
    else if (TB) wgmma_ss_001(d, adesc, bdesc, add);
    else wgmma_ss_000(d, adesc, bdesc, add);
#else
    __trap();
#endif
}
// A 64-row tile of 64 16-bit numbers a row (16 x 8 pairs of 16-bit numbers written by a warpgroup
// as mma's accumulator pairs): the address of the pair at (row r, column c even) in the 128-byte
// swizzle of tile_sw128 (16-byte chunk c / 8 of row r at chunk (c / 8) ^ (r % 8)).
__device__ __forceinline__ unsigned* sw_pair(half_t* tile, int r, int c) {
    return (unsigned*)(tile + r * 64 + (((c >> 3) ^ (r & 7)) << 3) + (c & 7));
}

// The block's n rows from row `first` of x (float32, strided), rounded, into a 64-wide swizzled tile
// (tile_sw128's layout); zeros past `last`. Generic stores: fence before the tensor cores read them.
template <int F16, int NTH> __device__ __forceinline__ void own_rows_sw(
        half_t* dst, const float* x, Strides s, int b, int h, int first, int n, int last) {
    for (int i = threadIdx.x; i < n * 16; i += NTH) {
        int j = i >> 4, c = (i & 15) * 4;
        float4 v = first + j < last ? *(const float4*)(row_at(x, s, b, h, first + j) + c)
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
        *(uint2*)sw_pair(dst, j, c) = make_uint2(pack<F16>(v.x, v.y), pack<F16>(v.z, v.w));
    }
}

// keyq by wgmma (CONFIG["key_wg"]): a block of 64 keys, one warpgroup (4 warps of 16 keys: wgmma's
// m64 accumulators are mma.sync's m16n8 fragments warp by warp, so the softmax is mma_key's), every
// operand of every product read by the tensor cores from 128-byte-swizzled shared memory
// (FlashAttention-3's dK, dV products from shared memory): K, V (K-major as A of Sᵀ = K Qᵀ, dPᵀ =
// V dOᵀ; K MN-major as B of dQ), Q, dO (K-major as B of Sᵀ, dPᵀ; MN-major as B of dV += Pᵀ dO, dK +=
// dSᵀ Q), Pᵀ and dSᵀ stored by the softmax (K-major as A of dV, dK; dSᵀ MN-major as A of dQ += dS
// K). What a thread holds: S, dP, then dK, dV, dQ (155-168 registers: 3 blocks a multiprocessor).
// A tile: its copies waited for, one barrier (the tile landed; every warp done with the tile before,
// whose buffers the next copies then take); the next tile's copies issued; S's product, then dP's,
// each its own group: P = exp(S·s − lse) computed while dP's runs (round 13); dSᵀ; Pᵀ, dSᵀ stored;
// a barrier; dQ's product in a group of its own, then dV's and dK's: dQ added by atomics while they
// run (round 13; both overlaps: backward −2 to −3 % at T 1,024-4,096, results/round13/bwd/). Grid
// (key blocks, B·H), or with LF (B·H, key blocks): blocks start x fastest, so the longest causal
// blocks of every head start first (the forward's LF, round 10). Queries past T: lse = +∞ makes p
// 0, δ = 0 makes dS 0; keys past S are zero rows (dQ adds 0; their dK, dV are not stored). Round 13
// measured 2 and 3 warpgroups a block sharing each Q, dO tile (FlashAttention-3's consumer
// warpgroups; one barrier a tile keeps them in step): 5-19 % slower, removed.
template <int F16, int LF> __device__ __forceinline__ void mma_key_ss(MMA_GRAD_ARGS) {
    enum { HD = 64, N = 64, M = 64, NTH = 128, NT = 8, DT = 8, KC = 4, TILE = 64 * 64 };
    S_(sk); S_(sv); S_(sdx); S_(sdy); S_(sdz);
    extern __shared__ __align__(16) half_t smem[];
    // the swizzle reads address bits 7-9 as the row: tiles 1024-byte aligned (the launch adds 1 KiB)
    half_t* qg = smem + (((1024u - (sm(smem) & 1023u)) & 1023u) >> 1);  // 2 x [Q tile; dO tile]
    half_t *ksw = qg + 4 * TILE, *vsw = ksw + TILE, *psw = vsw + TILE, *dsw = psw + TILE;
    float *ls = (float*)(dsw + TILE), *ds = ls + 2 * N;  // two buffers each of lse·log2e, δ
    int bh = LF ? blockIdx.x : blockIdx.y, b = bh / heads, h = bh % heads;
    int k0 = (LF ? blockIdx.y : blockIdx.x) * M, warp = threadIdx.x >> 5;
    int gi = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16, w0 = k0 + r0;
    const half_t *qb = qr + (long long)bh * Tp * HD, *gb = gr + (long long)bh * Tp * HD;
    const float *lb = lse + (long long)bh * T, *db = delta + (long long)bh * T;
    int first = causal ? k0 : 0, tiles = T > first ? (T - first + N - 1) / N : 0;  // k0 a multiple of N
    float c = scale * LOG2E, dk[DT][4], dv[DT][4];
#pragma unroll
    for (int i = 0; i < DT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
    if (tiles > 0) {
        tile_sw128<NTH>(qg, qb + (long long)first * HD, N);
        tile_sw128<NTH>(qg + TILE, gb + (long long)first * HD, N);
    }
    cp_commit();
    if (threadIdx.x < N) {
        int qi = first + threadIdx.x;
        ls[threadIdx.x] = qi < T ? lb[qi] * LOG2E : __int_as_float(0x7f800000);
        ds[threadIdx.x] = qi < T ? db[qi] : 0.f;
    }
    own_rows_sw<F16, NTH>(ksw, k, sk, b, h, k0, M, S);  // fenced with tile 0's copies below
    own_rows_sw<F16, NTH>(vsw, v, sv, b, h, k0, M, S);
    unsigned long long kd = sw128(ksw), vd = sw128(vsw), pd = sw128(psw), dd = sw128(dsw);
    for (int j = 0; j < tiles; ++j) {
        int i0 = first + j * N;
        cp_wait_all();
        async_proxy_fence();  // this thread's copies of tile j (and K's, V's rows) seen by wgmma
        __syncthreads();  // tile j landed; every warp done with tile j - 1 (its buffers free)
        float nl = 0.f, nd = 0.f;
        if (j + 1 < tiles) {  // into the buffer of tile j - 1
            half_t* nx = qg + ((j + 1) & 1) * 2 * TILE;
            tile_sw128<NTH>(nx, qb + (long long)(i0 + N) * HD, N);
            tile_sw128<NTH>(nx + TILE, gb + (long long)(i0 + N) * HD, N);
            int qi = i0 + N + threadIdx.x;
            if (threadIdx.x < N) {  // read now, stored after this tile's products
                nl = qi < T ? lb[qi] * LOG2E : __int_as_float(0x7f800000);
                nd = qi < T ? db[qi] : 0.f;
            }
        }
        cp_commit();
        const half_t *qs = qg + (j & 1) * 2 * TILE, *gs = qs + TILE;
        unsigned long long qd = sw128(qs), gd = sw128(gs);
        const float *lt = ls + (j & 1) * N, *dt = ds + (j & 1) * N;
        float s[NT][4], dp[NT][4];  // the first product of each writes it (add 0): no zeros first
        wg_hold<NT>(s);
        wg_hold<NT>(dp);
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < KC; ++kc)  // 16 columns of D: 32 bytes along each row
            wgmma_ss<F16, 0, 0>(&s[0][0], kd + 2 * kc, qd + 2 * kc, kc);
        wg_commit();  // S's group apart: its softmax under dP's product
#pragma unroll
        for (int kc = 0; kc < KC; ++kc)
            wgmma_ss<F16, 0, 0>(&dp[0][0], vd + 2 * kc, gd + 2 * kc, kc);
        wg_commit();
        bool edge = causal && i0 < w0 + 15;  // some query of the tile before some key of the warp's
        wg_wait<1>();
        wg_hold<NT>(s);
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int col = i * 8 + t * 2 + (e & 1), key = w0 + gi + (e >> 1) * 8;
                float p = ex2(fmaf(s[i][e], c, -lt[col]));
                s[i][e] = edge && key > i0 + col ? 0.f : p;
            }
        wg_wait<0>();
        wg_hold<NT>(s);
        wg_hold<NT>(dp);
#pragma unroll
        for (int i = 0; i < NT; ++i) {
#pragma unroll
            for (int e = 0; e < 4; ++e) dp[i][e] = s[i][e] * (dp[i][e] - dt[i * 8 + t * 2 + (e & 1)]);
            *sw_pair(psw, r0 + gi, i * 8 + t * 2) = pack<F16>(s[i][0], s[i][1]);
            *sw_pair(psw, r0 + gi + 8, i * 8 + t * 2) = pack<F16>(s[i][2], s[i][3]);
            *sw_pair(dsw, r0 + gi, i * 8 + t * 2) = pack<F16>(dp[i][0], dp[i][1]);
            *sw_pair(dsw, r0 + gi + 8, i * 8 + t * 2) = pack<F16>(dp[i][2], dp[i][3]);
        }
        async_proxy_fence();  // the Pᵀ, dSᵀ stores seen by the products below
        __syncthreads();  // Pᵀ, dSᵀ whole
        float dq[1][DT][4];  // the first product writes it (add 0)
        wg_hold<DT>(dv);
        wg_hold<DT>(dk);
        wg_hold<DT>(dq[0]);
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < KC; ++kc)  // 16 keys: 16 rows of dSᵀ, K (dQ's group first: its atomics
            wgmma_ss<F16, 1, 1>(&dq[0][0][0], dd + 128 * kc, kd + 128 * kc, kc);  // under dV's, dK's)
        wg_commit();
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {  // 16 queries: 32 bytes along Pᵀ's, dSᵀ's rows, 16 rows of dO, Q
            wgmma_ss<F16, 0, 1>(&dv[0][0], pd + 2 * kc, gd + 128 * kc, 1);
            wgmma_ss<F16, 0, 1>(&dk[0][0], dd + 2 * kc, qd + 128 * kc, 1);
        }
        wg_commit();
        wg_wait<1>();
        wg_hold<DT>(dq[0]);
        dq_add<1, DT>(dq, dz, sdz, b, h, i0 + r0, 0, T, scale);
        wg_wait<0>();
        wg_hold<DT>(dv);
        wg_hold<DT>(dk);
        if (j + 1 < tiles && threadIdx.x < N) {  // the other buffer: last read in tile j - 1
            ls[((j + 1) & 1) * N + threadIdx.x] = nl;
            ds[((j + 1) & 1) * N + threadIdx.x] = nd;
        }
    }
    if (COPIES && hz)
        dq_copy_tail<F16, HD, N, M, NTH>(dz, sdz, hz, counts, b, h, bh, first, tiles, T, causal,
                                         LF ? gridDim.y : gridDim.x);
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int key = w0 + gi + x * 8;
        if (key >= S) continue;
        float *kp = (float*)row_at(dx, sdx, b, h, key), *vp = (float*)row_at(dy, sdy, b, h, key);
#pragma unroll
        for (int i = 0; i < DT; ++i) {
            float lo = dk[i][2 * x] * scale, hi = dk[i][2 * x + 1] * scale;
            *(float2*)(kp + i * 8 + t * 2) = make_float2(lo, hi);
            put_pair<F16>(hx, kp + i * 8 + t * 2, dx, lo, hi);
            *(float2*)(vp + i * 8 + t * 2) = make_float2(dv[i][2 * x], dv[i][2 * x + 1]);
            put_pair<F16>(hy, vp + i * 8 + t * 2, dy, dv[i][2 * x], dv[i][2 * x + 1]);
        }
    }
}
"""

"""The tensor-core attention's key kernel on Hopper's warpgroup products (CUDA text, round 11, issue
37; attention_mma.py compiles it as keyq where CONFIG["key_wg"] asks and the modules are sm_90a's):
dK, dV and dQ by atomics as attention_mma_grad.py's mma_key, its four products over a key block by
wgmma.mma_async (the forward's wrappers, attention_mma_forward_wg.py), dQ's by mma.sync or wgmma.
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

// dK, dV, dQ (by atomics into dz, zeroed before) of a block of 64 keys, one warpgroup (4 warps of 16
// keys: wgmma's m64 accumulators are mma.sync's m16n8 fragments warp by warp, so the softmax code
// between the products is mma_key's), walking 64-query tiles (D 64 only):
//   Sᵀ = K Qᵀ, dPᵀ = V dOᵀ: A = the warp's K, V rows in registers (read once), B = the Q, dO tile
//     from 128-byte-swizzled shared memory, K-major (the forward's S = Q Kᵀ);
//   Pᵀ = exp(Sᵀ·s − lse), dSᵀ = Pᵀ ⊙ (dPᵀ − δ) in registers, rounded into A registers;
//   dV += Pᵀ dO, dK += dSᵀ Q: B = the same dO, Q tiles read MN-major (the forward's P V), issued
//     together and left running while dSᵀ goes through shared memory for
//   dQ += dS K (added by dq_add): DQW 0 by mma.sync (dS read transposed from dSᵀ, K the block's
//     rows, by ldmatrix); DQW 1 by wgmma, both operands from 128-byte-swizzled tiles read MN-major
//     (dSᵀ's rows are keys: A = dS transposed; K's rows are keys: B = K as it stands), the block's
//     K rows stored swizzled beside their padded copy (that KR's ldmatrix reads).
// Two buffers of the Q, dO tiles by cp.async: tile j + 1 lands while tile j's products run (every
// product of tile j - 1 waited for before the barrier that ends it). Grid (key blocks, B·H), or
// with LF (CONFIG["key_lf"]) (B·H, key blocks): blocks start x fastest, so the longest causal
// blocks (the first keys) of every head start first, as the forward's LF (round 10). Queries past
// T: lse = +∞ makes p 0, δ = 0 makes dS 0; keys past S are zero rows (dQ adds 0; their dK, dV are
// not stored).
template <int F16, int DQW, int LF> __device__ __forceinline__ void mma_key_wg(MMA_GRAD_ARGS) {
    enum { HD = 64, N = 64, M = 64, NTH = 128, NT = 8, DT = 8, KC = 4, P = HD + 8, PS = N + 8 };
    S_(sk); S_(sv); S_(sdx); S_(sdy); S_(sdz);
    extern __shared__ __align__(16) half_t smem[];
    // the swizzle reads address bits 7-9 as the row: tiles 1024-byte aligned (the launch adds 1 KiB)
    half_t* qg = smem + (((1024u - (sm(smem) & 1023u)) & 1023u) >> 1);  // 2 x [Q tile; dO tile]
    half_t *ksw = qg + 4 * N * HD, *dsw = ksw + M * HD;  // DQW: K's rows and dSᵀ, swizzled
    half_t *ks = qg + (DQW ? 6 : 4) * N * HD, *vs = ks + M * P;  // the block's K, V rows, padded
    float *ls = (float*)(vs + M * P), *ds = ls + 2 * N;  // two buffers each of lse·log2e, δ
    half_t* dst = (half_t*)(ds + 2 * N);  // DQW 0: dSᵀ of the tile, [M keys][N + 8]
    int bh = LF ? blockIdx.x : blockIdx.y, b = bh / heads, h = bh % heads;
    int k0 = (LF ? blockIdx.y : blockIdx.x) * M, warp = threadIdx.x >> 5;
    int gi = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16, w0 = k0 + r0;
    const half_t *qb = qr + (long long)bh * Tp * HD, *gb = gr + (long long)bh * Tp * HD;
    const float *lb = lse + (long long)bh * T, *db = delta + (long long)bh * T;
    int first = causal ? k0 : 0, tiles = T > first ? (T - first + N - 1) / N : 0;  // k0 a multiple of N
    float c = scale * LOG2E, dk[DT][4], dv[DT][4];
    unsigned kf[KC][4], vf[KC][4];
#pragma unroll
    for (int i = 0; i < DT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
    if (tiles > 0) {
        tile_sw128<NTH>(qg, qb + (long long)first * HD, N);
        tile_sw128<NTH>(qg + N * HD, gb + (long long)first * HD, N);
    }
    cp_commit();
    if (threadIdx.x < N) {
        int qi = first + threadIdx.x;
        ls[threadIdx.x] = qi < T ? lb[qi] * LOG2E : __int_as_float(0x7f800000);
        ds[threadIdx.x] = qi < T ? db[qi] : 0.f;
    }
    own_rows<F16, HD, NTH>(ks, k, sk, b, h, k0, M, S);
    own_rows<F16, HD, NTH>(vs, v, sv, b, h, k0, M, S);
    if (DQW)  // K's rows again, swizzled (fenced for the tensor cores at the loop's first barrier)
        for (int i = threadIdx.x; i < M * (HD / 4); i += NTH) {
            int j = i / (HD / 4), c = (i % (HD / 4)) * 4;
            float4 x = k0 + j < S ? *(const float4*)(row_at(k, sk, b, h, k0 + j) + c)
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
            *(uint2*)sw_pair(ksw, j, c) = make_uint2(pack<F16>(x.x, x.y), pack<F16>(x.z, x.w));
        }
    for (int j = 0; j < tiles; ++j) {
        int i0 = first + j * N;
        float nl = 0.f, nd = 0.f;
        if (j + 1 < tiles) {  // into the buffer of tile j - 1, free since the barrier ending it
            half_t* nx = qg + ((j + 1) & 1) * 2 * N * HD;
            tile_sw128<NTH>(nx, qb + (long long)(i0 + N) * HD, N);
            tile_sw128<NTH>(nx + N * HD, gb + (long long)(i0 + N) * HD, N);
            int qi = i0 + N + threadIdx.x;
            if (threadIdx.x < N) {  // read now, stored after this tile's products
                nl = qi < T ? lb[qi] * LOG2E : __int_as_float(0x7f800000);
                nd = qi < T ? db[qi] : 0.f;
            }
        }
        cp_commit();
        cp_wait_one();
        async_proxy_fence();  // this thread's copies of tile j (and K's swizzled rows) seen by wgmma
        __syncthreads();  // tile j landed (every thread's part)
        if (j == 0)  // the block's K, V landed (the barrier above)
#pragma unroll
            for (int kc = 0; kc < KC; ++kc) {
                frag_a(kf[kc], ks, P, r0, kc * 16);
                frag_a(vf[kc], vs, P, r0, kc * 16);
            }
        const half_t *qs = qg + (j & 1) * 2 * N * HD, *gs = qs + N * HD;
        const float *lt = ls + (j & 1) * N, *dt = ds + (j & 1) * N;
        float s[NT][4], dp[NT][4];  // the first product of each writes it (add 0): no zeros first
        wg_hold<NT>(s);
        wg_hold<NT>(dp);
        wg_fence();
        wg_scores<F16>(s, kf, sw128(qs));
        wg_scores<F16>(dp, vf, sw128(gs));
        wg_commit();
        wg_wait<0>();
        wg_hold<NT>(s);
        wg_hold<NT>(dp);
        bool edge = causal && i0 < w0 + 15;  // some query of the tile before some key of the warp's
        unsigned pf[NT / 2][4], df[NT / 2][4];
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int col = i * 8 + t * 2 + (e & 1), key = w0 + gi + (e >> 1) * 8;
                float p = ex2(fmaf(s[i][e], c, -lt[col]));
                if (edge && key > i0 + col) p = 0.f;
                s[i][e] = p;
                dp[i][e] = p * (dp[i][e] - dt[col]);
            }
#pragma unroll
        for (int kc = 0; kc < NT / 2; ++kc) {  // accumulator pairs of n-tiles 2kc, 2kc + 1: A fragments
            pf[kc][0] = pack<F16>(s[2 * kc][0], s[2 * kc][1]);
            pf[kc][1] = pack<F16>(s[2 * kc][2], s[2 * kc][3]);
            pf[kc][2] = pack<F16>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
            pf[kc][3] = pack<F16>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
            df[kc][0] = pack<F16>(dp[2 * kc][0], dp[2 * kc][1]);
            df[kc][1] = pack<F16>(dp[2 * kc][2], dp[2 * kc][3]);
            df[kc][2] = pack<F16>(dp[2 * kc + 1][0], dp[2 * kc + 1][1]);
            df[kc][3] = pack<F16>(dp[2 * kc + 1][2], dp[2 * kc + 1][3]);
        }
#pragma unroll
        for (int i = 0; i < NT; ++i) {  // dSᵀ for dQ: the same rounded numbers as dK's product reads
            if (DQW) {
                *sw_pair(dsw, r0 + gi, i * 8 + t * 2) = df[i >> 1][(i & 1) * 2];
                *sw_pair(dsw, r0 + gi + 8, i * 8 + t * 2) = df[i >> 1][(i & 1) * 2 + 1];
            } else {
                *(unsigned*)(dst + (r0 + gi) * PS + i * 8 + t * 2) = df[i >> 1][(i & 1) * 2];
                *(unsigned*)(dst + (r0 + gi + 8) * PS + i * 8 + t * 2) = df[i >> 1][(i & 1) * 2 + 1];
            }
        }
        wg_hold<DT>(dv);
        wg_hold<DT>(dk);
        wg_fence();
        wg_pv<F16>(dv, pf, sw128(gs));  // dV += Pᵀ dO
        wg_pv<F16>(dk, df, sw128(qs));  // dK += dSᵀ Q, both running through dQ's work below
        wg_commit();
        if (DQW) async_proxy_fence();  // the dSᵀ stores seen by dQ's wgmma
        __syncthreads();  // dSᵀ whole
        if (DQW) {  // dQ (the tile's 64 queries × HD) = dS K over the block's 64 keys, by wgmma
            float dq[1][DT][4];  // the first product writes it (add 0)
            wg_hold<DT>(dq[0]);
            wg_fence();
#pragma unroll
            for (int kc = 0; kc < M / 16; ++kc)  // 16 keys: 16 rows of each tile further
                wgmma_ss<F16, 1, 1>(&dq[0][0][0], sw128(dsw) + 128 * kc, sw128(ksw) + 128 * kc, kc);
            wg_commit();
            wg_wait<0>();
            wg_hold<DT>(dq[0]);
            dq_add<1, DT>(dq, dz, sdz, b, h, i0 + r0, 0, T, scale);
        } else {  // dQ (the tile's 16 queries of this warp × HD) = dS K over the block's 64 keys
            float dq[1][DT][4];
#pragma unroll
            for (int i = 0; i < DT; ++i) dq[0][i][0] = dq[0][i][1] = dq[0][i][2] = dq[0][i][3] = 0.f;
#pragma unroll
            for (int kc = 0; kc < M / 16; ++kc) {
                unsigned f[4];
                frag_at(f, dst, PS, kc * 16, r0);
#pragma unroll
                for (int np = 0; np < DT / 2; ++np) {
                    unsigned w[4];
                    frag_bt(w, ks, P, kc * 16, np * 16);
                    mma<F16>(dq[0][2 * np], f, w[0], w[1]);
                    mma<F16>(dq[0][2 * np + 1], f, w[2], w[3]);
                }
            }
            dq_add<1, DT>(dq, dz, sdz, b, h, i0 + r0, 0, T, scale);
        }
        wg_wait<0>();
        wg_hold<DT>(dv);
        wg_hold<DT>(dk);
        wg_hold_a<NT / 2>(pf);  // Pᵀ's and dSᵀ's registers kept until their products are done
        wg_hold_a<NT / 2>(df);
        if (j + 1 < tiles && threadIdx.x < N) {  // the other buffer: last read before the barrier above
            ls[((j + 1) & 1) * N + threadIdx.x] = nl;
            ds[((j + 1) & 1) * N + threadIdx.x] = nd;
        }
        __syncthreads();  // every warp done with tile j's buffers and dSᵀ
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

// key_wg 3: mma_key_wg's work with every operand of every product read by the tensor cores from
// 128-byte-swizzled shared memory (FlashAttention-3's dK, dV products from shared memory): K, V
// (the block's, K-major as A of Sᵀ, dPᵀ; K MN-major as B of dQ), Q, dO (K-major as B of Sᵀ, dPᵀ;
// MN-major as B of dK, dV), Pᵀ and dSᵀ stored by the softmax (K-major as A of dV, dK; dSᵀ
// MN-major as A of dQ). No A fragments in registers: S, dP, then dK, dV, dQ are what a thread
// holds (the register cap of 3 blocks a multiprocessor, 168, within reach). A tile: S and dP
// issued and waited for; the softmax; Pᵀ, dSᵀ stored; one barrier; dV, dK and dQ issued together
// and waited for; dQ added by atomics.
template <int F16, int LF> __device__ __forceinline__ void mma_key_ss(MMA_GRAD_ARGS) {
    enum { HD = 64, N = 64, M = 64, NTH = 128, NT = 8, DT = 8, KC = 4, TILE = 64 * 64 };
    S_(sk); S_(sv); S_(sdx); S_(sdy); S_(sdz);
    extern __shared__ __align__(16) half_t smem[];
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
        float nl = 0.f, nd = 0.f;
        if (j + 1 < tiles) {  // into the buffer of tile j - 1, free since the barrier ending it
            half_t* nx = qg + ((j + 1) & 1) * 2 * TILE;
            tile_sw128<NTH>(nx, qb + (long long)(i0 + N) * HD, N);
            tile_sw128<NTH>(nx + TILE, gb + (long long)(i0 + N) * HD, N);
            int qi = i0 + N + threadIdx.x;
            if (threadIdx.x < N) {
                nl = qi < T ? lb[qi] * LOG2E : __int_as_float(0x7f800000);
                nd = qi < T ? db[qi] : 0.f;
            }
        }
        cp_commit();
        cp_wait_one();
        async_proxy_fence();  // this thread's copies of tile j (and K's, V's rows) seen by wgmma
        __syncthreads();
        const half_t *qs = qg + (j & 1) * 2 * TILE, *gs = qs + TILE;
        unsigned long long qd = sw128(qs), gd = sw128(gs);
        const float *lt = ls + (j & 1) * N, *dt = ds + (j & 1) * N;
        float s[NT][4], dp[NT][4];
        wg_hold<NT>(s);
        wg_hold<NT>(dp);
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {  // 16 columns of D: 32 bytes along each row
            wgmma_ss<F16, 0, 0>(&s[0][0], kd + 2 * kc, qd + 2 * kc, kc);
            wgmma_ss<F16, 0, 0>(&dp[0][0], vd + 2 * kc, gd + 2 * kc, kc);
        }
        wg_commit();
        wg_wait<0>();
        wg_hold<NT>(s);
        wg_hold<NT>(dp);
        bool edge = causal && i0 < w0 + 15;
#pragma unroll
        for (int i = 0; i < NT; ++i) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int col = i * 8 + t * 2 + (e & 1), key = w0 + gi + (e >> 1) * 8;
                float p = ex2(fmaf(s[i][e], c, -lt[col]));
                if (edge && key > i0 + col) p = 0.f;
                s[i][e] = p;
                dp[i][e] = p * (dp[i][e] - dt[col]);
            }
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
        for (int kc = 0; kc < KC; ++kc) {  // 16 queries (dV, dK: 32 bytes along Pᵀ's, dSᵀ's rows,
            wgmma_ss<F16, 0, 1>(&dv[0][0], pd + 2 * kc, gd + 128 * kc, 1);  // 16 rows of dO, Q) or
            wgmma_ss<F16, 0, 1>(&dk[0][0], dd + 2 * kc, qd + 128 * kc, 1);  // 16 keys (dQ: 16 rows
            wgmma_ss<F16, 1, 1>(&dq[0][0][0], dd + 128 * kc, kd + 128 * kc, kc);  // of dSᵀ, K)
        }
        wg_commit();
        wg_wait<0>();
        wg_hold<DT>(dv);
        wg_hold<DT>(dk);
        wg_hold<DT>(dq[0]);
        dq_add<1, DT>(dq, dz, sdz, b, h, i0 + r0, 0, T, scale);
        if (j + 1 < tiles && threadIdx.x < N) {  // the other buffer: last read before the barrier above
            ls[((j + 1) & 1) * N + threadIdx.x] = nl;
            ds[((j + 1) & 1) * N + threadIdx.x] = nd;
        }
        __syncthreads();  // every warp done with tile j's buffers, Pᵀ and dSᵀ
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

"""The tensor-core attention's key kernel with FlashAttention-2's 2-D warp tiling (CUDA text, round
9b, issue 37; attention_mma.py compiles it as keyq where CONFIG["tiled"] says so): dK, dV and dQ by
atomics as attention_mma_grad.py's mma_key, every product tiled over a 2 × 2 grid of warps, P and dS
through shared memory. Uses the helpers of attention_mma_tiles.py and dq_copy_tail of _grad.
"""

KERNELS_BACKWARD_2D = r"""
// dK, dV, dQ (by float2 atomics into dz, zeroed before) of a block of M = 16·W keys walking 64-query
// tiles, W = 4 (8) warps on a 2 × 2 (4 × 2) grid of each product (FlashAttention-2's layout):
//   Sᵀ = K Qᵀ, dPᵀ = V dOᵀ: a warp's 32 keys (kr) × 32 queries (qc) (KR: its K, V rows kept in
//     registers as A fragments, so these two products read only Q, dO: 2 ldmatrix a 8 mma);
//   Pᵀ = exp(Sᵀ·s − lse), dSᵀ = Pᵀ ⊙ (dPᵀ − δ) stored rounded into shared memory;
//   dV += Pᵀ dO, dK += dSᵀ Q: a warp's 32 keys (kr) × HD / 2 columns (dc), both operands from
//     shared memory (4 ldmatrix a 8 mma at HD 64);
//   dQ = dS K: the warp's 32 queries (qd0) × 2·HD / W columns (dq0), dS read transposed from dSᵀ.
// By count at HD 64, KR: 64 ldmatrix.x4 a warp per 160 mma (0.4; mma_key with 16 keys a warp: 0.55);
// W = 8: 72 (0.45), and half the dQ atomics (each query tile gets one addition per 128 keys).
// Queries past T: lse = +∞ makes p 0, δ = 0 makes dS 0; keys past S are zero rows (dQ adds 0).
template <int F16, int HD, int W, int KR> __device__ __forceinline__ void mma_key2d(MMA_GRAD_ARGS) {
    enum { M = 16 * W, N = 64, NTH = 32 * W, KC = HD / 16, P = HD + 8, PS = N + 8, DHT = HD / 16,
           DQT = HD / (W / 2) / 8 };  // dQ: the warp's n-tiles
    static_assert((W == 4 || W == 8) && DHT % 2 == 0 && DQT % 2 == 0, "a warp's columns in whole pairs");
    S_(sq); S_(sk); S_(sv); S_(sdx); S_(sdy); S_(sdz);
    extern __shared__ __align__(16) half_t smem[];
    half_t *ks = smem, *vs = ks + M * P, *qg = vs + M * P;  // qg: two buffers of [Q; dO]
    float *ls = (float*)(qg + 4 * N * P), *ds = ls + 2 * N;  // two buffers each of lse·log2e, δ
    half_t *dst = (half_t*)(ds + 2 * N), *pst = dst + M * PS;  // dSᵀ, Pᵀ: [M keys][N + 8]
    int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    int k0 = blockIdx.x * M, warp = threadIdx.x >> 5;
    int gi = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    int kr0 = (warp >> 1) * 32, qc = (warp & 1) * 32, dc = (warp & 1) * (HD / 2);
    int qd0 = (warp & 1) * 32, dq0 = (warp >> 1) * (HD / (W / 2));  // dQ: the warp's queries, columns
    const half_t *qb = qr + (long long)bh * Tp * HD, *gb = gr + (long long)bh * Tp * HD;
    const float *lb = lse + (long long)bh * T, *db = delta + (long long)bh * T;
    int first = causal ? k0 : 0, tiles = T > first ? (T - first + N - 1) / N : 0;  // k0 a multiple of N
    float c = scale * LOG2E, dk[2][DHT][4], dv[2][DHT][4];
    unsigned kf[KR ? 2 : 1][KR ? KC : 1][4], vf[KR ? 2 : 1][KR ? KC : 1][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int i = 0; i < DHT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) dk[m][i][e] = dv[m][i][e] = 0.f;
    if (tiles > 0) {
        tile_async<HD, NTH>(qg, qb + (long long)first * HD, N);
        tile_async<HD, NTH>(qg + N * P, gb + (long long)first * HD, N);
    }
    cp_commit();
    if (threadIdx.x < N) {
        int qi = first + threadIdx.x;
        ls[threadIdx.x] = qi < T ? lb[qi] * LOG2E : __int_as_float(0x7f800000);
        ds[threadIdx.x] = qi < T ? db[qi] : 0.f;
    }
    own_rows<F16, HD, NTH>(ks, k, sk, b, h, k0, M, S);
    own_rows<F16, HD, NTH>(vs, v, sv, b, h, k0, M, S);
    for (int j = 0; j < tiles; ++j) {
        int i0 = first + j * N;
        float nl = 0.f, nd = 0.f;
        if (j + 1 < tiles) {
            half_t* nx = qg + ((j + 1) & 1) * 2 * N * P;
            tile_async<HD, NTH>(nx, qb + (long long)(i0 + N) * HD, N);
            tile_async<HD, NTH>(nx + N * P, gb + (long long)(i0 + N) * HD, N);
            int qi = i0 + N + threadIdx.x;
            if (threadIdx.x < N) {  // read now, stored after this tile's products
                nl = qi < T ? lb[qi] * LOG2E : __int_as_float(0x7f800000);
                nd = qi < T ? db[qi] : 0.f;
            }
        }
        cp_commit();
        cp_wait_one();
        __syncthreads();  // tile j landed; every warp done with tile j - 1's Pᵀ, dSᵀ
        if (KR && j == 0)  // the block's K, V landed (the barrier above)
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int kc = 0; kc < KC; ++kc) {
                    frag_a(kf[KR ? m : 0][KR ? kc : 0], ks, P, kr0 + m * 16, kc * 16);
                    frag_a(vf[KR ? m : 0][KR ? kc : 0], vs, P, kr0 + m * 16, kc * 16);
                }
        const half_t *qs = qg + (j & 1) * 2 * N * P, *gs = qs + N * P;
        const float *lt = ls + (j & 1) * N, *dt = ds + (j & 1) * N;
        if (!causal || i0 + qc + 31 >= k0 + kr0) {  // else every query of the warp's precedes its keys
            float s[2][4][4], dp[2][4][4];  // [key m-tile][query n-tile]
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[m][i][e] = dp[m][i][e] = 0.f;
#pragma unroll
            for (int kc = 0; kc < KC; ++kc) {
                unsigned a[2][4], av[2][4];
                if (!KR)
#pragma unroll
                    for (int m = 0; m < 2; ++m) {
                        frag_a(a[m], ks, P, kr0 + m * 16, kc * 16);
                        frag_a(av[m], vs, P, kr0 + m * 16, kc * 16);
                    }
#pragma unroll
                for (int np = 0; np < 2; ++np) {
                    unsigned w[4], u[4];
                    frag_b(w, qs, P, qc + np * 16, kc * 16);
                    frag_b(u, gs, P, qc + np * 16, kc * 16);
#pragma unroll
                    for (int m = 0; m < 2; ++m) {
                        const unsigned* fk = KR ? kf[KR ? m : 0][KR ? kc : 0] : a[m];
                        const unsigned* fv = KR ? vf[KR ? m : 0][KR ? kc : 0] : av[m];
                        mma<F16>(s[m][2 * np], fk, w[0], w[1]);
                        mma<F16>(s[m][2 * np + 1], fk, w[2], w[3]);
                        mma<F16>(dp[m][2 * np], fv, u[0], u[1]);
                        mma<F16>(dp[m][2 * np + 1], fv, u[2], u[3]);
                    }
                }
            }
            bool edge = causal && i0 + qc < k0 + kr0 + 31;  // some query before some key of the warp's
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        int col = qc + i * 8 + t * 2 + (e & 1), key = k0 + kr0 + m * 16 + gi + (e >> 1) * 8;
                        float p = ex2(fmaf(s[m][i][e], c, -lt[col]));
                        if (edge && key > i0 + col) p = 0.f;
                        s[m][i][e] = p;
                        dp[m][i][e] = p * (dp[m][i][e] - dt[col]);
                    }
                    half_t *pp = pst + (kr0 + m * 16 + gi) * PS + qc + i * 8 + t * 2;
                    half_t *dd = dst + (kr0 + m * 16 + gi) * PS + qc + i * 8 + t * 2;
                    *(unsigned*)pp = pack<F16>(s[m][i][0], s[m][i][1]);
                    *(unsigned*)(pp + 8 * PS) = pack<F16>(s[m][i][2], s[m][i][3]);
                    *(unsigned*)dd = pack<F16>(dp[m][i][0], dp[m][i][1]);
                    *(unsigned*)(dd + 8 * PS) = pack<F16>(dp[m][i][2], dp[m][i][3]);
                }
        } else {  // these keys see none of the warp's queries: zeros
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int x = 0; x < 2; ++x) {
                        int at = (kr0 + m * 16 + gi + x * 8) * PS + qc + i * 8 + t * 2;
                        *(unsigned*)(pst + at) = 0u;
                        *(unsigned*)(dst + at) = 0u;
                    }
        }
        __syncthreads();  // the tile's Pᵀ, dSᵀ whole
        // dV += Pᵀ dO, dK += dSᵀ Q over the tile's N queries (k), the warp's keys × columns
#pragma unroll
        for (int kc = 0; kc < N / 16; ++kc) {
            unsigned fp[2][4], fd[2][4];
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                frag_a(fp[m], pst, PS, kr0 + m * 16, kc * 16);
                frag_a(fd[m], dst, PS, kr0 + m * 16, kc * 16);
            }
#pragma unroll
            for (int np = 0; np < DHT / 2; ++np) {
                unsigned w[4], u[4];
                frag_bt(w, gs, P, kc * 16, dc + np * 16);
                frag_bt(u, qs, P, kc * 16, dc + np * 16);
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    mma<F16>(dv[m][2 * np], fp[m], w[0], w[1]);
                    mma<F16>(dv[m][2 * np + 1], fp[m], w[2], w[3]);
                    mma<F16>(dk[m][2 * np], fd[m], u[0], u[1]);
                    mma<F16>(dk[m][2 * np + 1], fd[m], u[2], u[3]);
                }
            }
        }
        {  // dQ (the warp's 32 queries × 2·HD / W columns) = dS K over the block's M keys, by atomics
            float dq[2][DQT][4];
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int i = 0; i < DQT; ++i) dq[m][i][0] = dq[m][i][1] = dq[m][i][2] = dq[m][i][3] = 0.f;
#pragma unroll
            for (int kc = 0; kc < M / 16; ++kc) {
                unsigned f[2][4];
#pragma unroll
                for (int m = 0; m < 2; ++m) frag_at(f[m], dst, PS, kc * 16, qd0 + m * 16);
#pragma unroll
                for (int np = 0; np < DQT / 2; ++np) {
                    unsigned w[4];
                    frag_bt(w, ks, P, kc * 16, dq0 + np * 16);
#pragma unroll
                    for (int m = 0; m < 2; ++m) {
                        mma<F16>(dq[m][2 * np], f[m], w[0], w[1]);
                        mma<F16>(dq[m][2 * np + 1], f[m], w[2], w[3]);
                    }
                }
            }
            dq_add<2, DQT>(dq, dz, sdz, b, h, i0 + qd0, dq0, T, scale);
        }
        if (j + 1 < tiles && threadIdx.x < N) {  // the other buffer: last read before the barrier above
            ls[((j + 1) & 1) * N + threadIdx.x] = nl;
            ds[((j + 1) & 1) * N + threadIdx.x] = nd;
        }
        __syncthreads();  // before the next prefetch overwrites this tile's Q, dO buffer
    }
    if (COPIES && hz)
        dq_copy_tail<F16, HD, N, M, NTH>(dz, sdz, hz, counts, b, h, bh, first, tiles, T, causal, gridDim.x);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            int key = k0 + kr0 + m * 16 + gi + x * 8;
            if (key >= S) continue;
            float *kp = (float*)row_at(dx, sdx, b, h, key) + dc;
            float *vp = (float*)row_at(dy, sdy, b, h, key) + dc;
#pragma unroll
            for (int i = 0; i < DHT; ++i) {
                float lo = dk[m][i][2 * x] * scale, hi = dk[m][i][2 * x + 1] * scale;
                *(float2*)(kp + i * 8 + t * 2) = make_float2(lo, hi);
                put_pair<F16>(hx, kp + i * 8 + t * 2, dx, lo, hi);
                *(float2*)(vp + i * 8 + t * 2) = make_float2(dv[m][i][2 * x], dv[m][i][2 * x + 1]);
                put_pair<F16>(hy, vp + i * 8 + t * 2, dy, dv[m][i][2 * x], dv[m][i][2 * x + 1]);
            }
        }
}
"""

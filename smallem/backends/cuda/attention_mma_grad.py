"""The second tensor-core attention's backward kernel (CUDA text; attention_mma.py compiles and
launches it with its shared helpers): dK and dV a block of keys at a time walking query tiles, dQ
added by atomics from it, each warp owning 16 keys. The walked tiles come by cp.async into two
buffers (Q staged in float32 where CONFIG says); every fragment by ldmatrix; the outputs' 16-bit
copies beside them. (dQ by its own pass over key tiles, 7 products and no atomics, was 9-18 %
slower in round 10 and removed in round 11: results/round10/attention_bwd.md.)
"""

KERNELS_BACKWARD = r"""
#define MMA_GRAD_ARGS const float* q, const float* k, const float* v, const float* g, \
        const half_t* qr, const half_t* kr, const half_t* vr, const half_t* gr, const float* lse, \
        const float* delta, float* dx, float* dy, float* dz, half_t* hx, half_t* hy, half_t* hz, \
        unsigned* counts, STRIDES(sq), STRIDES(sk), STRIDES(sv), \
        STRIDES(sg), STRIDES(sdx), STRIDES(sdy), STRIDES(sdz), int heads, int T, int S, int Tp, int Sp, \
        float scale, int causal
// hz (dQ's copy, dQ by atomics): the last key block to add to a query tile writes its 16-bit copy,
// once every block has fenced once (a fence a tile cost a quarter of the backward: round 8).
// `blocks`: the launch's key blocks a head.
template <int F16, int HD, int N, int M, int NTH> __device__ __forceinline__ void dq_copy_tail(
        float* dz, Strides sdz, half_t* hz, unsigned* counts, int b, int h, int bh, int first, int tiles,
        int T, int causal, int blocks) {
    __shared__ int lasts[NTH], nlast;  // the query tiles this block added to last
 // the last key block to add to a query tile writes dQ's copy: once every block
    __threadfence();  // has fenced once (a fence a tile cost a quarter of the backward: round 8)
    __syncthreads();  // this block's additions are seen by all before its counts say so
    for (int c0 = 0; c0 < tiles; c0 += NTH) {  // a thread a tile: the tiles this block was last on
        if (threadIdx.x == 0) nlast = 0;
        __syncthreads();
        if (c0 + threadIdx.x < tiles) {
            int i0 = first + (c0 + threadIdx.x) * N;  // adders: all key blocks, or (causal) k0 < i0 + N
            unsigned adders = causal ? min(blocks, (i0 + N + M - 1) / M) : blocks;
            unsigned* count = counts + (long long)bh * ((T + N - 1) / N) + i0 / N;
            if (atomicAdd(count, 1u) == adders - 1) {
                *count = 0u;  // zeros again for the next launch
                lasts[atomicAdd(&nlast, 1)] = i0;
            }
        }
        __syncthreads();
        __threadfence();
        for (int x = 0; x < nlast; ++x)
            for (int i = threadIdx.x; i < N * (HD / 2); i += NTH) {
                int row = lasts[x] + i / (HD / 2), c = (i % (HD / 2)) * 2;
                if (row >= T) break;
                const float* at = row_at(dz, sdz, b, h, row) + c;
                float2 x2 = __ldcg((const float2*)at);  // from L2, where the atomics added
                put_pair<F16>(hz, at, dz, x2.x, x2.y);
            }
        __syncthreads();  // before nlast and lasts are written again
    }
}

// dK, dV: each warp 16 key rows; per query tile Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ = exp(Sᵀ·s − lse),
// dSᵀ = Pᵀ ⊙ (dPᵀ − δ), dV += Pᵀ dO, dK += dSᵀ Q. K and V (the block's own) rounded from
// float32, Q and dO walked with their tiles' lse and δ. Grid (key blocks, B·H), longest first.
// dQ (FlashAttention-2's way): dS also goes to shared memory, and dQ += dS K of this block's keys is
// added to dz (zeroed before) by float2 atomics: 5 products in all; with hz, the last block to add
// to a query tile (counted in counts, zeros before, left zeros) writes dQ's 16-bit copy. hx, hy
// (not null): dK's and dV's copies. ST = 1 (round 8): Q read from the float32 q by cp.async into a
// float32 stage and rounded in shared memory (no convert launch for Q). KR = 1 (round 9): the
// warp's K and V rows read as A fragments once, kept in registers.
template <int F16, int HD, int N, int W, int ST, int KR>
__device__ __forceinline__ void mma_key(MMA_GRAD_ARGS) {
    enum { M = 16 * W, NTH = 32 * W, NT = N / 8, DT = HD / 8, KC = HD / 16, P = HD + 8, PS = N + 8,
           MTS = N / 16, PARTS = W > MTS ? W / MTS : 1, DQT = DT / PARTS };  // dQ's jobs
    static_assert(DQT % 2 == 0 && DQT * PARTS == DT, "dQ's columns split in whole pairs");
    S_(sq); S_(sk); S_(sv); S_(sdx); S_(sdy); S_(sdz);
    extern __shared__ __align__(16) half_t smem[];
    half_t *ks = smem, *vs = ks + M * P, *qg = vs + M * P;  // qg: two buffers of [Q; dO]
    float *ls = (float*)(qg + 4 * N * P), *ds = ls + 2 * N;  // two buffers each of lse·log2e, δ
    half_t* dst = (half_t*)(ds + 2 * N);  // dSᵀ of the tile, [M keys][N + 8]
    float* qst = (float*)(dst + M * PS);  // ST: Q's float32 stage, [N][HD]
    int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    int k0 = blockIdx.x * M, warp = threadIdx.x >> 5;
    int gi = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16, w0 = k0 + r0;
    const half_t *qb = qr + (long long)bh * Tp * HD, *gb = gr + (long long)bh * Tp * HD;
    const float *lb = lse + (long long)bh * T, *db = delta + (long long)bh * T;
    int first = causal ? (k0 / N) * N : 0, tiles = T > first ? (T - first + N - 1) / N : 0;
    float c = scale * LOG2E, dk[DT][4], dv[DT][4];
    unsigned kf[KR ? KC : 1][4], vf[KR ? KC : 1][4];  // KR: the warp's K and V as A fragments
#pragma unroll
    for (int i = 0; i < DT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
    if (tiles > 0) {
        if (ST) stage_async<HD, NTH>(qst, q, sq, b, h, first, N, T);
        else tile_async<HD, NTH>(qg, qb + (long long)first * HD, N);
        tile_async<HD, NTH>(qg + N * P, gb + (long long)first * HD, N);
    }
    cp_commit();
    if (threadIdx.x < N) {  // queries past T: lse = +∞ makes p 0, δ = 0 makes dS 0
        int qi = first + threadIdx.x;
        ls[threadIdx.x] = qi < T ? lb[qi] * LOG2E : __int_as_float(0x7f800000);
        ds[threadIdx.x] = qi < T ? db[qi] : 0.f;
    }
    own_rows<F16, HD, NTH>(ks, k, sk, b, h, k0, M, S);
    own_rows<F16, HD, NTH>(vs, v, sv, b, h, k0, M, S);
    for (int j = 0; j < tiles; ++j) {
        int i0 = first + j * N;
        float nl = 0.f, nd = 0.f;
        if (ST) {  // Q's tile j is in the stage (dO's in its buffer): Q rounded into its buffer
            cp_wait_all();
            __syncthreads();  // every thread's copies landed, every warp done with tile j - 1
            stage_round<F16, HD, NTH>(qg + (j & 1) * 2 * N * P, qst, N);
            __syncthreads();
        }
        if (j + 1 < tiles) {
            half_t* nx = qg + ((j + 1) & 1) * 2 * N * P;
            if (ST) stage_async<HD, NTH>(qst, q, sq, b, h, i0 + N, N, T);
            else tile_async<HD, NTH>(nx, qb + (long long)(i0 + N) * HD, N);
            tile_async<HD, NTH>(nx + N * P, gb + (long long)(i0 + N) * HD, N);
            int qi = i0 + N + threadIdx.x;
            if (threadIdx.x < N) {  // read now, stored after this tile's products (in flight meanwhile)
                nl = qi < T ? lb[qi] * LOG2E : __int_as_float(0x7f800000);
                nd = qi < T ? db[qi] : 0.f;
            }
        }
        cp_commit();
        if (!ST) {
            cp_wait_one();
            __syncthreads();
        }
        if (KR && j == 0)  // the block's K, V landed (the barrier above)
#pragma unroll
            for (int kc = 0; kc < KC; ++kc) {
                frag_a(kf[kc], ks, P, r0, kc * 16);
                frag_a(vf[kc], vs, P, r0, kc * 16);
            }
        const half_t *qs = qg + (j & 1) * 2 * N * P, *gs = qs + N * P;
        const float *lt = ls + (j & 1) * N, *dt = ds + (j & 1) * N;
        if (!causal || i0 + N - 1 >= w0) {  // else every query of the tile precedes these keys
            float s[NT][4], dp[NT][4];
#pragma unroll
            for (int i = 0; i < NT; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
            if (KR) {
                mma_fbt<F16, KC, NT, P>(s, kf, qs);
                mma_fbt<F16, KC, NT, P>(dp, vf, gs);
            } else {
                mma_abt<F16, KC, NT, P>(s, ks, r0, qs);
                mma_abt<F16, KC, NT, P>(dp, vs, r0, gs);
            }
            bool edge = causal && i0 < w0 + 15;
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
            mma_pb<F16, NT, DT, P>(dv, s, gs);
            mma_pb<F16, NT, DT, P>(dk, dp, qs);
#pragma unroll
            for (int i = 0; i < NT; ++i) {
                *(unsigned*)(dst + (r0 + gi) * PS + i * 8 + t * 2) = pack<F16>(dp[i][0], dp[i][1]);
                *(unsigned*)(dst + (r0 + gi + 8) * PS + i * 8 + t * 2) = pack<F16>(dp[i][2], dp[i][3]);
            }
        } else {  // these keys add nothing to this tile's dQ
#pragma unroll
            for (int i = 0; i < NT; ++i) {
                *(unsigned*)(dst + (r0 + gi) * PS + i * 8 + t * 2) = 0u;
                *(unsigned*)(dst + (r0 + gi + 8) * PS + i * 8 + t * 2) = 0u;
            }
        }
        {  // dQ (N × HD) += dS (N × M, read transposed from dSᵀ) · K (M × HD): a warp's job
            __syncthreads();  // is 16 queries × HD / PARTS columns, so that every warp has one
            for (int job = warp; job < MTS * PARTS; job += W) {
                int mt = job % MTS, d0 = (job / MTS) * DQT * 8;
                float dq[1][DQT][4];
#pragma unroll
                for (int i = 0; i < DQT; ++i) dq[0][i][0] = dq[0][i][1] = dq[0][i][2] = dq[0][i][3] = 0.f;
#pragma unroll
                for (int kc = 0; kc < M / 16; ++kc) {
                    unsigned f[4];
                    frag_at(f, dst, PS, kc * 16, mt * 16);
#pragma unroll
                    for (int np = 0; np < DQT / 2; ++np) {
                        unsigned w[4];
                        frag_bt(w, ks, P, kc * 16, d0 + np * 16);
                        mma<F16>(dq[0][2 * np], f, w[0], w[1]);
                        mma<F16>(dq[0][2 * np + 1], f, w[2], w[3]);
                    }
                }
                dq_add<1, DQT>(dq, dz, sdz, b, h, i0 + mt * 16, d0, T, scale);
            }
        }
        if (j + 1 < tiles && threadIdx.x < N) {  // the other buffer: last read before the sync above
            ls[((j + 1) & 1) * N + threadIdx.x] = nl;
            ds[((j + 1) & 1) * N + threadIdx.x] = nd;
        }
        __syncthreads();
    }
    if (COPIES && hz)
        dq_copy_tail<F16, HD, N, M, NTH>(dz, sdz, hz, counts, b, h, bh, first, tiles, T, causal, gridDim.x);
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

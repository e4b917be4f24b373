"""The tensor-core attention's forward kernel (CUDA text; attention_mma.py compiles and launches
it with its shared helpers, attention_mma_tiles.py): O and the log-sum-exp by the online softmax,
each warp owning 16 query rows (MT of them), P re-packed in registers as the A fragments of P·V.
"""

KERNELS = r"""
#define MMA_FORWARD_ARGS const float* q, const float* k, const float* v, const half_t* kr, \
        const half_t* vr, float* o, half_t* oh, float* lse, STRIDES(sq), STRIDES(sk), STRIDES(sv), \
        STRIDES(so), int heads, int T, int S, int Tp, int Sp, float scale, int causal, half_t* qk
// O by the online softmax: each warp MT·16 query rows (their S tiles and O in registers; each
// K or V fragment read from shared memory feeds MT products), the block's Q and two buffers of
// K, V tiles in shared memory. Grid (query blocks, B·H), longest rows first.
// ST = 0: K, V walked in 16-bit rows (kr, vr: their converts). ST = 1 (round 8): read from the
// float32 k, v by cp.async into a float32 stage while the tensor cores work, then rounded into
// one 16-bit buffer: no convert launch. oh (not null): O's 16-bit copy, at O's offsets.
// QR = 1 (round 9): the warp's Q fragments read from shared memory once and kept in registers
// (FlashAttention-2's way), not read again for every key tile.
// LF = 1 (round 10): grid (B·H, query blocks), so that the blocks start in the order of their
// work on every head at once (a causal block's tiles grow with its query tile: the longest of
// all heads first, the shortest last, a short tail); LF = 0: grid (query blocks, B·H), longest
// first within each head only, a head's longest blocks starting late.
// LZ = 1 (round 10): O and l rescaled only where some row's running max moved (alpha exactly 1
// elsewhere: the same numbers, the multiplications skipped for the whole warp).
template <int F16, int HD, int N, int W, int MT, int ST, int QR, int LF, int LZ>
__device__ __forceinline__ void mma_forward(MMA_FORWARD_ARGS) {
    enum { M = 16 * W * MT, NTH = 32 * W, NT = N / 8, DT = HD / 8, KC = HD / 16, P = HD + 8 };
    S_(sq); S_(sk); S_(sv); S_(so);
    extern __shared__ __align__(16) half_t smem[];
    half_t *qs = smem, *kv = qs + M * P;  // kv: two buffers of [K tile; V tile] (ST: one)
    float* st = (float*)(kv + 2 * N * P);  // ST: the float32 stage [K tile; V tile], rows of HD
    int bh = LF ? blockIdx.x : blockIdx.y, b = bh / heads, h = bh % heads;
    int q0 = (LF ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x) * M, warp = threadIdx.x >> 5;
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16 * MT, w0 = q0 + r0;
    const half_t *kb = kr + (long long)bh * Sp * HD, *vb = vr + (long long)bh * Sp * HD;
    int tiles = ((causal ? min(S, q0 + M) : S) + N - 1) / N;
    if (ST) {
        stage_async<HD, NTH>(st, k, sk, b, h, 0, N, S);
        stage_async<HD, NTH>(st + N * HD, v, sv, b, h, 0, N, S);
    } else {
        tile_async<HD, NTH>(kv, kb, N);
        tile_async<HD, NTH>(kv + N * P, vb, N);
    }
    cp_commit();
    own_rows<F16, HD, NTH>(qs, q, sq, b, h, q0, M, T, qk ? qk + (long long)bh * Tp * HD : qk, Tp);
    float c = scale * LOG2E, m[MT][2], l[MT][2], acc[MT][DT][4];
    unsigned qf[QR ? MT : 1][QR ? KC : 1][4];  // QR: the warp's Q as A fragments
#pragma unroll
    for (int u = 0; u < MT; ++u) {
        m[u][0] = m[u][1] = NEG_INF;
        l[u][0] = l[u][1] = 0.f;
#pragma unroll
        for (int i = 0; i < DT; ++i) acc[u][i][0] = acc[u][i][1] = acc[u][i][2] = acc[u][i][3] = 0.f;
    }
    for (int j = 0; j < tiles; ++j) {
        if (ST) {  // tile j is in the stage: rounded into the buffer, then tile j + 1 fetched
            cp_wait_all();
            __syncthreads();  // every thread's copies landed, every warp done with tile j - 1
            stage_round<F16, HD, NTH>(kv, st, N);
            stage_round<F16, HD, NTH>(kv + N * P, st + N * HD, N);
            __syncthreads();  // the buffer written, the stage read
            if (j + 1 < tiles) {  // lands while this tile is multiplied
                stage_async<HD, NTH>(st, k, sk, b, h, (j + 1) * N, N, S);
                stage_async<HD, NTH>(st + N * HD, v, sv, b, h, (j + 1) * N, N, S);
            }
            cp_commit();
        } else {
            if (j + 1 < tiles) {  // the next tile lands while this one is multiplied
                half_t* nx = kv + ((j + 1) & 1) * 2 * N * P;
                tile_async<HD, NTH>(nx, kb + (long long)(j + 1) * N * HD, N);
                tile_async<HD, NTH>(nx + N * P, vb + (long long)(j + 1) * N * HD, N);
            }
            cp_commit();
            cp_wait_one();
            __syncthreads();
        }
        if (QR && j == 0)  // the block's Q landed (the barrier above): this warp's fragments
#pragma unroll
            for (int u = 0; u < MT; ++u)
#pragma unroll
                for (int kc = 0; kc < KC; ++kc) frag_a(qf[u][kc], qs, P, r0 + 16 * u, kc * 16);
        const half_t *ks = kv + (ST ? 0 : (j & 1) * 2 * N * P), *vs = ks + N * P;
        int j0 = j * N;
        if (!causal || j0 <= w0 + 16 * MT - 1) {  // else none of this warp's rows sees these keys
            float s[MT][NT][4];
#pragma unroll
            for (int u = 0; u < MT; ++u)
#pragma unroll
                for (int i = 0; i < NT; ++i) s[u][i][0] = s[u][i][1] = s[u][i][2] = s[u][i][3] = 0.f;
#pragma unroll
            for (int kc = 0; kc < KC; ++kc) {  // S = Q Kᵀ
                unsigned f[MT][4];
#pragma unroll
                for (int u = 0; u < MT; ++u) {
                    if (QR) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) f[u][e] = qf[u][kc][e];
                    } else {
                        frag_a(f[u], qs, P, r0 + 16 * u, kc * 16);
                    }
                }
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    unsigned w[4];
                    frag_b(w, ks, P, np * 16, kc * 16);
#pragma unroll
                    for (int u = 0; u < MT; ++u) {
                        mma<F16>(s[u][2 * np], f[u], w[0], w[1]);
                        mma<F16>(s[u][2 * np + 1], f[u], w[2], w[3]);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < MT; ++u) {
                int u0 = w0 + 16 * u;  // this m-tile's first row
                if (j0 + N > S || (causal && j0 + N - 1 > u0)) {  // the diagonal or the last keys
#pragma unroll
                    for (int i = 0; i < NT; ++i)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            int key = j0 + i * 8 + t * 2 + (e & 1), row = u0 + g + (e >> 1) * 8;
                            if (key >= S || (causal && key > row)) s[u][i][e] = NEG_INF;
                        }
                }
                float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
                for (int i = 0; i < NT; ++i) {
                    mx[0] = fmaxf(mx[0], fmaxf(s[u][i][0], s[u][i][1]));
                    mx[1] = fmaxf(mx[1], fmaxf(s[u][i][2], s[u][i][3]));
                }
                float base[2], alpha[2];
#pragma unroll
                for (int x = 0; x < 2; ++x) {
                    float mn = fmaxf(m[u][x], quad_max(mx[x]) * c);
                    base[x] = mn == NEG_INF ? 0.f : mn;  // a row with no key yet: its p are all 0
                    alpha[x] = ex2(m[u][x] - base[x]);
                    m[u][x] = mn;
                }
                // LZ: a vote of the warp (uniform branch); alpha is exactly 1 where the max stayed
                bool moved = !LZ || __any_sync(FULL, alpha[0] != 1.f || alpha[1] != 1.f);
                if (moved) {
                    l[u][0] *= alpha[0];
                    l[u][1] *= alpha[1];
                }
#pragma unroll
                for (int i = 0; i < NT; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[u][i][e] = ex2(fmaf(s[u][i][e], c, -base[e >> 1]));
                        l[u][e >> 1] += s[u][i][e];  // this thread's part of the row sum
                    }
                if (moved)
#pragma unroll
                    for (int i = 0; i < DT; ++i) {
                        acc[u][i][0] *= alpha[0]; acc[u][i][1] *= alpha[0];
                        acc[u][i][2] *= alpha[1]; acc[u][i][3] *= alpha[1];
                    }
            }
#pragma unroll
            for (int kc = 0; kc < NT / 2; ++kc) {  // O += P V, P rounded as it is read
                unsigned f[MT][4];
#pragma unroll
                for (int u = 0; u < MT; ++u) {
                    f[u][0] = pack<F16>(s[u][2 * kc][0], s[u][2 * kc][1]);
                    f[u][1] = pack<F16>(s[u][2 * kc][2], s[u][2 * kc][3]);
                    f[u][2] = pack<F16>(s[u][2 * kc + 1][0], s[u][2 * kc + 1][1]);
                    f[u][3] = pack<F16>(s[u][2 * kc + 1][2], s[u][2 * kc + 1][3]);
                }
#pragma unroll
                for (int np = 0; np < DT / 2; ++np) {
                    unsigned w[4];
                    frag_bt(w, vs, P, kc * 16, np * 16);
#pragma unroll
                    for (int u = 0; u < MT; ++u) {
                        mma<F16>(acc[u][2 * np], f[u], w[0], w[1]);
                        mma<F16>(acc[u][2 * np + 1], f[u], w[2], w[3]);
                    }
                }
            }
        }
        if (!ST) __syncthreads();  // before the next copy overwrites this buffer
    }
#pragma unroll
    for (int u = 0; u < MT; ++u)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            int row = w0 + 16 * u + g + x * 8;
            float sum = quad_sum(l[u][x]);
            if (row >= T) continue;
            float inv = 1.f / sum, *op = (float*)row_at(o, so, b, h, row);
#pragma unroll
            for (int i = 0; i < DT; ++i) {
                float lo = acc[u][i][2 * x] * inv, hi = acc[u][i][2 * x + 1] * inv;
                *(float2*)(op + i * 8 + t * 2) = make_float2(lo, hi);
                put_pair<F16>(oh, op + i * 8 + t * 2, o, lo, hi);
            }
            if (t == 0) lse[(long long)bh * T + row] = (m[u][x] + log2f(sum)) * LN2;
        }
}
"""

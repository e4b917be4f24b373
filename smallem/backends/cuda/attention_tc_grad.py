"""The tensor-core attention's backward kernels (CUDA text; attention_tc.py compiles and launches
them with its shared helpers): dQ a query row at a time, dK and dV a key row at a time, each
warp owning 16 rows, the products as mma.sync m16n8k16, float32 accumulators, no atomics.
"""

KERNELS_BACKWARD = r"""
#define TC_GRAD_ARGS const half_t* q, const half_t* qt, const half_t* k, const half_t* kt, \
        const half_t* v, const half_t* g, const half_t* gt, const float* lse, const float* delta, \
        float* dx, float* dy, STRIDES(sdx), STRIDES(sdy), int heads, int T, int S, int Tp, int Sp, \
        float scale, int causal
// dQ: each warp 16 query rows; per key tile S = Q Kᵀ, dP = dO Vᵀ, dS = P ⊙ (dP − δ), dQ += dS K.
template <int F16, int HD, int N> __device__ __forceinline__ void tc_query(TC_GRAD_ARGS) {
    enum { M = 64, NT = N / 8, DT = HD / 8, KC = HD / 16, P = HD + 8 };
    S_(sdx);
    extern __shared__ __align__(16) half_t smem[];
    half_t *qs = smem, *gs = qs + M * P, *ks = gs + M * P, *vs = ks + N * P, *kts = vs + N * P;
    int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    int tile = gridDim.x - 1 - blockIdx.x, q0 = tile * M, warp = threadIdx.x >> 5;
    int gi = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16;
    float c = scale * LOG2E, l2[2], dl[2], dq[DT][4];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int row = min(q0 + r0 + gi + x * 8, T - 1);
        l2[x] = lse[(long long)bh * T + row] * LOG2E;
        dl[x] = delta[(long long)bh * T + row];
    }
#pragma unroll
    for (int i = 0; i < DT; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
    copy_rows<HD>(qs, q + (long long)bh * Tp * HD, q0, M);
    copy_rows<HD>(gs, g + (long long)bh * Tp * HD, q0, M);
    int last = causal ? min(S, q0 + M) : S;
    for (int j0 = 0; j0 < last; j0 += N) {
        __syncthreads();
        copy_rows<HD>(ks, k + (long long)bh * Sp * HD, j0, N);
        copy_cols<HD>(kts, kt + (long long)bh * HD * Sp, Sp, j0, N);
        copy_rows<HD>(vs, v + (long long)bh * Sp * HD, j0, N);
        __syncthreads();
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
        mma_abt<F16, KC, NT>(s, qs, P, r0, ks, P);
        mma_abt<F16, KC, NT>(dp, gs, P, r0, vs, P);
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int key = j0 + i * 8 + t * 2 + (e & 1), row = q0 + r0 + gi + (e >> 1) * 8;
                float p = (key >= S || (causal && key > row)) ? 0.f : exp2f(s[i][e] * c - l2[e >> 1]);
                s[i][e] = p * (dp[i][e] - dl[e >> 1]);
            }
        mma_pbt<F16, NT, DT>(dq, s, kts, N + 8);
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int row = q0 + r0 + gi + x * 8;
        if (row >= T) continue;
        float* op = (float*)row_at(dx, sdx, b, h, row);
#pragma unroll
        for (int i = 0; i < DT; ++i)
            *(float2*)(op + i * 8 + t * 2) = make_float2(dq[i][2 * x] * scale, dq[i][2 * x + 1] * scale);
    }
}

// dK, dV: each warp 16 key rows; per query tile Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ = exp(Sᵀ·s − lse),
// dSᵀ = Pᵀ ⊙ (dPᵀ − δ), dV += Pᵀ dO, dK += dSᵀ Q. Grid (key tiles, B·H), longest first.
template <int F16, int HD, int N> __device__ __forceinline__ void tc_key(TC_GRAD_ARGS) {
    enum { M = 64, NT = N / 8, DT = HD / 8, KC = HD / 16, P = HD + 8 };
    S_(sdx); S_(sdy);
    extern __shared__ __align__(16) half_t smem[];
    half_t *ks = smem, *vs = ks + M * P, *qs = vs + M * P, *gs = qs + N * P, *qts = gs + N * P;
    half_t* gts = qts + HD * (N + 8);
    float *ls = (float*)(gts + HD * (N + 8)), *ds = ls + N;
    int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    int k0 = blockIdx.x * M, warp = threadIdx.x >> 5;
    int gi = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16;
    float c = scale * LOG2E, dk[DT][4], dv[DT][4];
#pragma unroll
    for (int i = 0; i < DT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
    copy_rows<HD>(ks, k + (long long)bh * Sp * HD, k0, M);
    copy_rows<HD>(vs, v + (long long)bh * Sp * HD, k0, M);
    for (int i0 = causal ? (k0 / N) * N : 0; i0 < T; i0 += N) {
        __syncthreads();
        copy_rows<HD>(qs, q + (long long)bh * Tp * HD, i0, N);
        copy_cols<HD>(qts, qt + (long long)bh * HD * Tp, Tp, i0, N);
        copy_rows<HD>(gs, g + (long long)bh * Tp * HD, i0, N);
        copy_cols<HD>(gts, gt + (long long)bh * HD * Tp, Tp, i0, N);
        if (threadIdx.x < N) {  // queries past T: lse = +∞ makes p 0, δ = 0 makes dS 0
            int qi = i0 + threadIdx.x;
            ls[threadIdx.x] = qi < T ? lse[(long long)bh * T + qi] * LOG2E : __int_as_float(0x7f800000);
            ds[threadIdx.x] = qi < T ? delta[(long long)bh * T + qi] : 0.f;
        }
        __syncthreads();
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
        mma_abt<F16, KC, NT>(s, ks, P, r0, qs, P);
        mma_abt<F16, KC, NT>(dp, vs, P, r0, gs, P);
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int col = i * 8 + t * 2 + (e & 1), key = k0 + r0 + gi + (e >> 1) * 8;
                float p = (causal && key > i0 + col) ? 0.f : exp2f(s[i][e] * c - ls[col]);
                s[i][e] = p;
                dp[i][e] = p * (dp[i][e] - ds[col]);
            }
        mma_pbt<F16, NT, DT>(dv, s, gts, N + 8);
        mma_pbt<F16, NT, DT>(dk, dp, qts, N + 8);
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int key = k0 + r0 + gi + x * 8;
        if (key >= S) continue;
        float *kp = (float*)row_at(dx, sdx, b, h, key), *vp = (float*)row_at(dy, sdy, b, h, key);
#pragma unroll
        for (int i = 0; i < DT; ++i) {
            *(float2*)(kp + i * 8 + t * 2) = make_float2(dk[i][2 * x] * scale, dk[i][2 * x + 1] * scale);
            *(float2*)(vp + i * 8 + t * 2) = make_float2(dv[i][2 * x], dv[i][2 * x + 1]);
        }
    }
}
"""

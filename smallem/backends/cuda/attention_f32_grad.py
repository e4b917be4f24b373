"""The backward of the float32 flash attention (attention_f32.py), as FlashAttention-2's: δ and
dQ's zeros in one pass, then one kernel per key tile keeping dK, dV in registers and adding dQ by
float4 atomics. CUDA source only; attention_f32.py joins it to the forward's and launches it.
"""

GRAD_KERNELS = r"""
// δ_i = rowsum(dO_i ⊙ O_i) and row i of dQ zeroed for the atomics: HD/4 threads a row zero it
// (a float4 each), the first of them sums the row in the order the backward's dP = dO·v runs
// (one fmaf chain from column 0): at T = 1, where O = v, dP − δ is then exactly 0, as float64's.
#define DELTA_ARGS const float* o, const float* g, float* delta, float* dq, STRIDES(so), \
        STRIDES(sg), STRIDES(sz), int heads, int T, int rows
template <int HD> __device__ __forceinline__ void delta_zero(DELTA_ARGS) {
    S_(so); S_(sg); S_(sz);
    long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int i = (int)(id / (HD / 4)), c = (int)(id % (HD / 4));
    if (i >= rows) return;
    int t = i % T, bh = i / T, b = bh / heads, h = bh % heads;
    ((float4*)atw(dq, sz, b, h, t))[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c) return;
    const float4 *op = (const float4*)at(o, so, b, h, t), *gp = (const float4*)at(g, sg, b, h, t);
    float s = 0.f;
#pragma unroll
    for (int d = 0; d < HD / 4; ++d) {
        float4 x = op[d], y = gp[d];
        s = fmaf(y.x, x.x, s); s = fmaf(y.y, x.y, s); s = fmaf(y.z, x.z, s); s = fmaf(y.w, x.w, s);
    }
    delta[i] = s;
}

// A block owns BN keys (K, V in shared memory, dK, dV in registers) and walks the query tiles of
// BM rows that see them (Q, dO by cp.async). Per tile: S and dP = dO Vᵀ on the forward's thread
// tiles (rows ty + SY·a, keys tx + KX·b), P = exp2(S·c − lse·log2e) and dS = P (dP − δ) into
// shared memory; then dV += Pᵀ dO, dK += dSᵀ Q on tiles of keys (uy·JR + b, columns 4·ux), and
// dQ += dS K on rows uy + TY·a, columns 4·ux, added to dQ by float4 atomics. QB query buffers:
// 1, a tile's Q, dO land after the last tile's readers are done and are waited for; 2, the next
// tile's Q, dO, lse and δ land (cp.async) in the other buffers while this one is worked on, rows
// past T repeating row T − 1 (their p masked to 0); 3 (round 11), one buffer: the next tile's Q,
// dO, lse and δ are issued into it once dK's and dV's products are done with this one, and land
// while dQ's product (dS and K alone) runs: QB 2's overlap at QB 1's shared memory, for one
// barrier more a tile. DL, dK and dV's layout: 1, a warp owns JR keys
// × all HD columns (P, dS read as broadcasts); 2 (HD a multiple of 64, NT/32 = BN/16 · HD/64), a
// warp owns 16 keys × 64 columns, a thread 4 keys × 8 columns (4·cl + {0, 32}): per query row a
// warp reads 6 shared-memory wavefronts for 64 FMAs instead of 12; 3, DL 2's and dQ alike (NT/32 =
// BM/16 · HD/64): a warp 16 query rows × 64 columns, a thread rows 4·a + lane/8, 8 columns.
#define GRAD_ARGS const float* q, const float* k, const float* v, const float* g, \
        const float* lse, const float* delta, float* dq, float* dk, float* dv, STRIDES(sq), \
        STRIDES(sk), STRIDES(sv), STRIDES(sg), STRIDES(sdq), STRIDES(sdk), STRIDES(sdv), \
        int heads, int T, int S, float scale, int causal
__device__ __forceinline__ void cp4(float* dst, const float* src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(d), "l"(src));
}
template <int HD, int BM, int BN, int NT, int KX, int QB, int DL> __device__ __forceinline__ void
bwd(GRAD_ARGS) {
    enum { SY = NT / KX, RI = BM / SY, RJ = BN / KX, TX = HD / 4, TY = NT / TX, JR = BN / TY,
           IR = BM / TY, PD = HD + 4, PP = BN + KX, DKN = DL >= 2 ? 4 : JR, DKE = DL >= 2 ? 8 : 4,
           NWK = BN >= 16 ? BN / 16 : 1, NWQ = BM >= 16 ? BM / 16 : 1, NB = QB == 2 ? 2 : 1 };
    extern __shared__ __align__(16) float smem[];
    float *ks = smem, *vs = ks + BN * PD, *qs = vs + BN * PD, *gs = qs + NB * BM * PD,
          *ps = gs + NB * BM * PD, *dss = ps + BM * PP, *ls = dss + BM * PP, *dl = ls + NB * BM;
    S_(sq); S_(sk); S_(sv); S_(sg); S_(sdq); S_(sdk); S_(sdv);
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, tx = threadIdx.x % KX,
        ty = threadIdx.x / KX, ux = threadIdx.x % TX, uy = threadIdx.x / TX;
    int j0 = blockIdx.x * BN;  // the first blocks have the most causal work: scheduled first
    int first = causal ? (j0 / BM) * BM : 0;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;  // DL 2, 3: its dK, dV keys, columns
    int k2 = (warp % NWK) * 16 + (lane / 8) * 4, c2 = (warp / NWK) * 64 + (lane % 8) * 4;
    int r3 = (warp % NWQ) * 16 + lane / 8, c3 = (warp / NWQ) * 64 + (lane % 8) * 4;  // DL 3's dQ
    const float *lrow = lse + (long long)bh * T, *drow = delta + (long long)bh * T;
    tile_async<HD, BN, PD, NT>(ks, k, sk, b, h, j0, S - 1);
    tile_async<HD, BN, PD, NT>(vs, v, sv, b, h, j0, S - 1);
    if (QB >= 2 && first < T) {  // the first query tile in the same group as K, V
        tile_async<HD, BM, PD, NT>(qs, q, sq, b, h, first, T - 1);
        tile_async<HD, BM, PD, NT>(gs, g, sg, b, h, first, T - 1);
        for (int r = threadIdx.x; r < BM; r += NT) {
            cp4(ls + r, lrow + min(first + r, T - 1));
            cp4(dl + r, drow + min(first + r, T - 1));
        }
    }
    cp_commit();
    float c = scale * LOG2E, dkr[DKN][DKE], dvr[DKN][DKE];
#pragma unroll
    for (int j = 0; j < DKN; ++j)
#pragma unroll
        for (int e = 0; e < DKE; ++e) dkr[j][e] = dvr[j][e] = 0.f;
    for (int i0 = first, n = 0; i0 < T; i0 += BM, ++n) {
        int buf = QB == 2 ? (n & 1) : 0;
        float *qt = qs + buf * BM * PD, *gt = gs + buf * BM * PD, *lt = ls + buf * BM,
              *dt = dl + buf * BM;
        if (QB != 3) __syncthreads();  // the last tile's readers are done (QB 3: before dQ's product)
        if (QB == 3) {  // this tile's copies were issued before the last tile's dQ product
            cp_wait<0>();
        } else if (QB == 1) {
            tile_async<HD, BM, PD, NT>(qt, q, sq, b, h, i0, T - 1);
            tile_async<HD, BM, PD, NT>(gt, g, sg, b, h, i0, T - 1);
            cp_commit();
            for (int r = threadIdx.x; r < BM; r += NT) {  // rows past T: p = 0 (lse = +∞), δ = 0
                int qi = i0 + r;
                lt[r] = qi < T ? lrow[qi] * LOG2E : POS_INF;
                dt[r] = qi < T ? drow[qi] : 0.f;
            }
            cp_wait<0>();
        } else if (i0 + BM < T) {  // the next tile into the other buffers (read two tiles ago)
            int nb = (buf ^ 1) * BM, next = i0 + BM;
            tile_async<HD, BM, PD, NT>(qs + nb * PD, q, sq, b, h, next, T - 1);
            tile_async<HD, BM, PD, NT>(gs + nb * PD, g, sg, b, h, next, T - 1);
            for (int r = threadIdx.x; r < BM; r += NT) {
                cp4(ls + nb + r, lrow + min(next + r, T - 1));
                cp4(dl + nb + r, drow + min(next + r, T - 1));
            }
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        float s[RI][RJ], dp[RI][RJ];
#pragma unroll
        for (int a = 0; a < RI; ++a)
#pragma unroll
            for (int j = 0; j < RJ; ++j) s[a][j] = dp[a][j] = 0.f;
#pragma unroll 2
        for (int d = 0; d < HD; d += 4) {
            float qa[RI][4], ga[RI][4], kb[RJ][4], vb[RJ][4];
#pragma unroll
            for (int a = 0; a < RI; ++a) {
                lds<4>(qa[a], qt + (ty + SY * a) * PD + d);
                lds<4>(ga[a], gt + (ty + SY * a) * PD + d);
            }
#pragma unroll
            for (int j = 0; j < RJ; ++j) {
                lds<4>(kb[j], ks + (tx + KX * j) * PD + d);
                lds<4>(vb[j], vs + (tx + KX * j) * PD + d);
            }
#pragma unroll
            for (int a = 0; a < RI; ++a)
#pragma unroll
                for (int j = 0; j < RJ; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[a][j] = fmaf(qa[a][e], kb[j][e], s[a][j]);
                        dp[a][j] = fmaf(ga[a][e], vb[j][e], dp[a][j]);
                    }
        }
#pragma unroll
        for (int a = 0; a < RI; ++a) {
            int r = ty + SY * a;
#pragma unroll
            for (int j = 0; j < RJ; ++j) {
                int key = j0 + tx + KX * j;
                bool zero = key >= S || (causal && key > i0 + r) || (QB >= 2 && i0 + r >= T);
                float p = zero ? 0.f : exp2f(s[a][j] * c - (QB >= 2 ? lt[r] * LOG2E : lt[r]));
                ps[r * PP + tx + KX * j] = p;
                dss[r * PP + tx + KX * j] = p * (dp[a][j] - dt[r]);
            }
        }
        __syncthreads();
#pragma unroll 2
        for (int i = 0; DL >= 2 && i < BM; ++i) {
            float pj[4], sj[4], go[8], qo[8];
            lds<4>(pj, ps + i * PP + k2);
            lds<4>(sj, dss + i * PP + k2);
            lds<4>(go, gt + i * PD + c2);
            lds<4>(go + 4, gt + i * PD + c2 + 32);
            lds<4>(qo, qt + i * PD + c2);
            lds<4>(qo + 4, qt + i * PD + c2 + 32);
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    dvr[j][e] = fmaf(pj[j], go[e], dvr[j][e]);
                    dkr[j][e] = fmaf(sj[j], qo[e], dkr[j][e]);
                }
        }
#pragma unroll 2
        for (int i = 0; DL == 1 && i < BM; ++i) {
            float pj[JR], sj[JR], go[4], qo[4];
            lds<JR>(pj, ps + i * PP + uy * JR);
            lds<JR>(sj, dss + i * PP + uy * JR);
            lds<4>(go, gt + i * PD + 4 * ux);
            lds<4>(qo, qt + i * PD + 4 * ux);
#pragma unroll
            for (int j = 0; j < JR; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    dvr[j][e] = fmaf(pj[j], go[e], dvr[j][e]);
                    dkr[j][e] = fmaf(sj[j], qo[e], dkr[j][e]);
                }
        }
        if (QB == 3) {  // Q, dO, lse, δ are read no more in this tile: the next tile's land
            __syncthreads();  // into the same buffers while dQ's product (dS, K alone) runs
            if (i0 + BM < T) {
                tile_async<HD, BM, PD, NT>(qt, q, sq, b, h, i0 + BM, T - 1);
                tile_async<HD, BM, PD, NT>(gt, g, sg, b, h, i0 + BM, T - 1);
                for (int r = threadIdx.x; r < BM; r += NT) {
                    cp4(lt + r, lrow + min(i0 + BM + r, T - 1));
                    cp4(dt + r, drow + min(i0 + BM + r, T - 1));
                }
                cp_commit();
            }
        }
        if (DL == 3) {
            float dq3[4][8];
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int e = 0; e < 8; ++e) dq3[a][e] = 0.f;
#pragma unroll 2
            for (int j = 0; j < BN; j += 4) {
                float sa[4][4];
#pragma unroll
                for (int a = 0; a < 4; ++a) lds<4>(sa[a], dss + (r3 + 4 * a) * PP + j);
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    float kk[8];
                    lds<4>(kk, ks + (j + u) * PD + c3);
                    lds<4>(kk + 4, ks + (j + u) * PD + c3 + 32);
#pragma unroll
                    for (int a = 0; a < 4; ++a)
#pragma unroll
                        for (int e = 0; e < 8; ++e) dq3[a][e] = fmaf(sa[a][u], kk[e], dq3[a][e]);
                }
            }
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                int row = i0 + r3 + 4 * a;
                if (row >= T) continue;
                float* out = atw(dq, sdq, b, h, row) + c3;
#pragma unroll
                for (int e = 0; e < 8; e += 4)
                    atomicAdd((float4*)(out + 8 * e), make_float4(dq3[a][e] * scale,
                              dq3[a][e + 1] * scale, dq3[a][e + 2] * scale, dq3[a][e + 3] * scale));
            }
            continue;
        }
        float dqr[IR][4];
#pragma unroll
        for (int a = 0; a < IR; ++a)
#pragma unroll
            for (int e = 0; e < 4; ++e) dqr[a][e] = 0.f;
#pragma unroll 2
        for (int j = 0; j < BN; j += 4) {
            float sa[IR][4];
#pragma unroll
            for (int a = 0; a < IR; ++a) lds<4>(sa[a], dss + (uy + TY * a) * PP + j);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                float kk[4];
                lds<4>(kk, ks + (j + u) * PD + 4 * ux);
#pragma unroll
                for (int a = 0; a < IR; ++a)
#pragma unroll
                    for (int e = 0; e < 4; ++e) dqr[a][e] = fmaf(sa[a][u], kk[e], dqr[a][e]);
            }
        }
#pragma unroll
        for (int a = 0; a < IR; ++a) {
            int row = i0 + uy + TY * a;
            if (row < T)
                atomicAdd((float4*)atw(dq, sdq, b, h, row) + ux, make_float4(
                    dqr[a][0] * scale, dqr[a][1] * scale, dqr[a][2] * scale, dqr[a][3] * scale));
        }
    }
#pragma unroll
    for (int j = 0; j < DKN; ++j) {
        int key = j0 + (DL >= 2 ? k2 : uy * JR) + j;
        if (key >= S) continue;
#pragma unroll
        for (int e = 0; e < DKE; ++e) dkr[j][e] *= scale;
#pragma unroll
        for (int e = 0; e < DKE; e += 4) {  // DL 2, 3: columns c2 and c2 + 32
            int col = DL >= 2 ? c2 + 8 * e : 4 * ux;
            stg<4>(atw(dk, sdk, b, h, key) + col, dkr[j] + e);
            stg<4>(atw(dv, sdv, b, h, key) + col, dvr[j] + e);
        }
    }
}
"""

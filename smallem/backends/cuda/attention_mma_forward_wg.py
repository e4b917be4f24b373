"""The tensor-core attention's forward on Hopper's warpgroup products (round 10, issue 37): the
same online softmax as attention_mma_forward.py's mma_forward, S = Q Kᵀ and O += P V by
wgmma.mma_async (sm_90a) with K and V read by the tensor cores from shared memory (no ldmatrix);
attention_mma.py compiles it beside the others where CONFIG["forward_opts"] asks for it.
"""


def _wgmma(f16: int, tb: int) -> str:
    """The CUDA function wgmma_<f16><tb>: D (64 x 64, float32, 32 registers a thread) = A (64 x 16,
    4 registers a thread, mma.sync's A layout per warp) · B (16 x 64 from a shared-memory
    descriptor; tb 0: K-major, 1: MN-major) + D where `add`, else + 0."""
    kind = "f16" if f16 else "bf16"
    d = ", ".join(f"%{i}" for i in range(32))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(32))
    return (f"__device__ __forceinline__ void wgmma_{f16}{tb}(float* d, const unsigned* a, "
            f"unsigned long long desc, int add) {{\n"
            f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %37, 0;\\n"\n'
            f'                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.{kind}.{kind} "\n'
            f'                 "{{{d}}}, {{%32, %33, %34, %35}}, %36, p, 1, 1, {tb};\\n}}\\n"\n'
            f"                 : {outs}\n"
            f'                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(add));\n}}\n')


KERNELS_WG = r"""
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_OK 1
""" + "".join(_wgmma(f, t) for f in (0, 1) for t in (0, 1)) + r"""
#else
#define WG_OK 0
#endif
template <int F16, int TB> __device__ __forceinline__ void wgmma(float* d, const unsigned* a,
                                                                 unsigned long long desc, int add) {
#if WG_OK
    if (F16 && TB) wgmma_11(d, a, desc, add);
    else if (F16) wgmma_10(d, a, desc, add);
    else if (TB) wgmma_01(d, a, desc, add);
    else wgmma_00(d, a, desc, add);
#else
    __trap();  // compiled without sm_90a (NVRTC's plain sm_90): a launch error, never wrong numbers
#endif
}
__device__ __forceinline__ void wg_fence() {
#if WG_OK
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
// The accumulators as the compiler sees them: read and written here, so no use of them is moved
// across the asynchronous product's issue or wait.
template <int R> __device__ __forceinline__ void wg_hold(float (*x)[4]) {
#pragma unroll
    for (int i = 0; i < R; ++i)
        asm volatile("" : "+f"(x[i][0]), "+f"(x[i][1]), "+f"(x[i][2]), "+f"(x[i][3]) :: "memory");
}
// A shared-memory descriptor of a 128-byte-swizzled tile (rows of 128 bytes, 8-row groups 1024
// bytes apart, the 16-byte chunk c of row r at chunk c ^ (r % 8)): the PTX ISA's canonical
// layout, K-major (K's rows for S = Q Kᵀ) or MN-major (V's rows for O = P V, read transposed).
__device__ __forceinline__ unsigned long long sw128(const half_t* p) {
    return (unsigned long long)((sm(p) & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
// n rows of 64 16-bit numbers (a padded row copy, at the first row) into a swizzled tile, async.
template <int NTH> __device__ __forceinline__ void tile_sw128(half_t* dst, const half_t* src, int n) {
#pragma unroll 4
    for (int i = threadIdx.x; i < n * 8; i += NTH) {
        int j = i >> 3, c = i & 7;
        cp16(dst + j * 64 + ((c ^ (j & 7)) << 3), src + (long long)j * 64 + c * 8);
    }
}
__device__ __forceinline__ void async_proxy_fence() {  // cp.async's writes, seen by the wgmma reads
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// The online softmax of one key tile of a warp's 16 rows (S in s, from the product): masked
// where the tile crosses the diagonal or S's end, m and l moved on, P rounded into pf (the A
// registers of P V, 16 keys each); alpha (O's factor) returned, `moved` whether any row's is not 1
// (LZ; else always true). NT: the tile's keys / 8 (64 keys; 128 in mma_forward_wgq).
template <int F16, int LZ, int NT = 8> __device__ __forceinline__ bool wg_softmax(
        float (*s)[4], float* m, float* l, float* alpha, unsigned (*pf)[4], float c, int j0, int w0,
        int S, int causal) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    if (j0 + NT * 8 > S || (causal && j0 + NT * 8 - 1 > w0)) {  // the diagonal or the last keys
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int key = j0 + i * 8 + t * 2 + (e & 1), row = w0 + g + (e >> 1) * 8;
                if (key >= S || (causal && key > row)) s[i][e] = NEG_INF;
            }
    }
    float mx[2] = {NEG_INF, NEG_INF}, base[2];
#pragma unroll
    for (int i = 0; i < NT; ++i) {
        mx[0] = fmaxf(mx[0], fmaxf(s[i][0], s[i][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[i][2], s[i][3]));
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        float mn = fmaxf(m[x], quad_max(mx[x]) * c);
        base[x] = mn == NEG_INF ? 0.f : mn;  // a row with no key yet: its p are all 0
        alpha[x] = ex2(m[x] - base[x]);
        m[x] = mn;
    }
    bool moved = !LZ || __any_sync(FULL, alpha[0] != 1.f || alpha[1] != 1.f);
    if (moved) {
        l[0] *= alpha[0];
        l[1] *= alpha[1];
    }
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[i][e] = ex2(fmaf(s[i][e], c, -base[e >> 1]));
            l[e >> 1] += s[i][e];
        }
#pragma unroll
    for (int kc = 0; kc < NT / 2; ++kc) {
        pf[kc][0] = pack<F16>(s[2 * kc][0], s[2 * kc][1]);
        pf[kc][1] = pack<F16>(s[2 * kc][2], s[2 * kc][3]);
        pf[kc][2] = pack<F16>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
        pf[kc][3] = pack<F16>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
    }
    return moved;
}
template <int F16> __device__ __forceinline__ void wg_scores(float (*s)[4], const unsigned (*qf)[4],
                                                             unsigned long long kd) {
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) wgmma<F16, 0>(&s[0][0], qf[kc], kd + 2 * kc, kc);  // + 32 bytes
}
template <int F16> __device__ __forceinline__ void wg_pv(float (*acc)[4], const unsigned (*pf)[4],
                                                         unsigned long long vd) {
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) wgmma<F16, 1>(&acc[0][0], pf[kc], vd + 128 * kc, 1);  // + 16 rows
}
__device__ __forceinline__ void wg_commit() {
#if WG_OK
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void wg_wait() {  // all but the N latest groups done
#if WG_OK
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
#endif
}
template <int R> __device__ __forceinline__ void wg_hold_a(unsigned (*x)[4]) {  // A registers read
#pragma unroll
    for (int i = 0; i < R; ++i)
        asm volatile("" : "+r"(x[i][0]), "+r"(x[i][1]), "+r"(x[i][2]), "+r"(x[i][3]) :: "memory");
}
// After a tile's softmax (both forwards, 64 keys, D 64): P_{j-1} V_{j-1} waited for, O rescaled
// where a row's max moved, P_j's registers (pn) kept in pf for the next tile's P V.
__device__ __forceinline__ void wg_rescale(float (*acc)[4], unsigned (*pf)[4], const unsigned (*pn)[4],
                                           const float* alpha, bool moved) {
    wg_wait<0>();
    wg_hold<8>(acc);
    wg_hold_a<4>(pf);  // P_{j-1}'s registers kept until its product is done
    if (moved)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            acc[i][0] *= alpha[0]; acc[i][1] *= alpha[0];
            acc[i][2] *= alpha[1]; acc[i][3] *= alpha[1];
        }
#pragma unroll
    for (int kc = 0; kc < 4; ++kc)
#pragma unroll
        for (int e = 0; e < 4; ++e) pf[kc][e] = pn[kc][e];
}
// A warpgroup's last P V (its last tile's), issued and waited for.
template <int F16> __device__ __forceinline__ void wg_last_pv(float (*acc)[4], const unsigned (*pf)[4],
                                                              unsigned long long vd) {
    wg_hold<8>(acc);
    wg_fence();
    wg_pv<F16>(acc, pf, vd);
    wg_commit();
    wg_wait<0>();
    wg_hold<8>(acc);
}
// O by the online softmax, W / 4 warpgroups of 64 query rows a block, 64-key tiles (D 64 only):
// each warp's 16 rows hold S and O in registers as mma_forward's (the product's accumulator
// layout is mma.sync's per warp), P re-packed as the A registers of P V. LF, LZ as mma_forward's.
// FlashAttention-3's overlap within a warpgroup: S_j = Q K_jᵀ issued, then P_{j-1} V_{j-1}, the
// softmax of S_j run while the tensor cores still add P_{j-1} V_{j-1}, O rescaled after it;
// three buffers of K, V, so that tile j + 1 lands while V_{j-1} is still read. (Round 10's first
// form, each product waited for as issued with two buffers, gave O 20-70 % off float64 past one
// key tile, results/round10/attention_fwd.md: removed, its cause not found.)
template <int F16, int W, int LF, int LZ>
__device__ __forceinline__ void mma_forward_wg(MMA_FORWARD_ARGS) {
    enum { HD = 64, N = 64, M = 16 * W, NTH = 32 * W, NT = N / 8, DT = HD / 8, KC = HD / 16, P = HD + 8,
           NB = 3 };
    S_(sq); S_(so);
    extern __shared__ __align__(16) half_t smem[];
    // the swizzle reads address bits 7-9 as the row: tiles 1024-byte aligned (the launch adds 1 KiB)
    half_t* kv = smem + (((1024u - (sm(smem) & 1023u)) & 1023u) >> 1);  // NB x [K tile; V tile]
    half_t* qs = kv + NB * 2 * N * HD;
    int bh = LF ? blockIdx.x : blockIdx.y, b = bh / heads, h = bh % heads;
    int q0 = (LF ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x) * M, warp = threadIdx.x >> 5;
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, w0 = q0 + warp * 16;
    // the warpgroup's last row (it skips the tiles past it), by a shuffle: a value ptxas knows is
    // the same across the warp, so the products in branches on it need no serializing waits
    int last = q0 + __shfl_sync(FULL, threadIdx.x >> 7, 0) * 64 + 63;
    const half_t *kb = kr + (long long)bh * Sp * HD, *vb = vr + (long long)bh * Sp * HD;
    int tiles = ((causal ? min(S, q0 + M) : S) + N - 1) / N;
    int mine = causal ? min(tiles, (min(S, last + 1) + N - 1) / N) : tiles;  // this warpgroup's
    tile_sw128<NTH>(kv, kb, N);
    tile_sw128<NTH>(kv + N * HD, vb, N);
    cp_commit();
    own_rows<F16, HD, NTH>(qs, q, sq, b, h, q0, M, T, qk ? qk + (long long)bh * Tp * HD : qk, Tp);
    float c = scale * LOG2E, m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f}, acc[DT][4], alpha[2];
    unsigned qf[KC][4], pf[NT / 2][4];
    unsigned long long vd = 0;  // the V tile of the product still to issue
#pragma unroll
    for (int i = 0; i < DT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    for (int j = 0; j < tiles; ++j) {
        half_t* nx = kv + ((j + 1) % NB) * 2 * N * HD;
        cp_wait_all();
        async_proxy_fence();
        __syncthreads();  // tile j landed; every warp past tile j - 1: P_{j-2} V_{j-2} done
        if (j + 1 < tiles) {  // into the buffer of tile j - 2, free since the barrier
            tile_sw128<NTH>(nx, kb + (long long)(j + 1) * N * HD, N);
            tile_sw128<NTH>(nx + N * HD, vb + (long long)(j + 1) * N * HD, N);
        }
        cp_commit();
        if (j == 0)
#pragma unroll
            for (int kc = 0; kc < KC; ++kc) frag_a(qf[kc], qs, P, warp * 16, kc * 16);
        const half_t* ks = kv + (j % NB) * 2 * N * HD;
        float s[NT][4];  // the first product writes S (add 0): no zeros first
        if (j < mine) {
            wg_hold<NT>(s);
            wg_hold<DT>(acc);
            wg_fence();
            wg_scores<F16>(s, qf, sw128(ks));
            wg_commit();
            if (j > 0) {
                wg_pv<F16>(acc, pf, vd);  // P_{j-1} V_{j-1}, still running through the softmax
                wg_commit();
                wg_wait<1>();
            } else {
                wg_wait<0>();
            }
            wg_hold<NT>(s);
            unsigned pn[NT / 2][4];
            bool moved = wg_softmax<F16, LZ>(s, m, l, alpha, pn, c, j * N, w0, S, causal);
            wg_rescale(acc, pf, pn, alpha, moved);
            vd = sw128(ks + N * HD);
        } else if (j == mine) {  // this warpgroup's last P V, before tile j + 1 takes a buffer
            wg_last_pv<F16>(acc, pf, vd);
        }
    }
    if (mine == tiles) wg_last_pv<F16>(acc, pf, vd);
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int row = w0 + g + x * 8;
        float sum = quad_sum(l[x]);
        if (row >= T) continue;
        float inv = 1.f / sum, *op = (float*)row_at(o, so, b, h, row);
#pragma unroll
        for (int i = 0; i < DT; ++i) {
            float lo = acc[i][2 * x] * inv, hi = acc[i][2 * x + 1] * inv;
            *(float2*)(op + i * 8 + t * 2) = make_float2(lo, hi);
            put_pair<F16>(oh, op + i * 8 + t * 2, o, lo, hi);
        }
        if (t == 0) lse[(long long)bh * T + row] = (m[x] + log2f(sum)) * LN2;
    }
}
"""

"""The tensor-core attention's forward for long sequences on Hopper (round 13, issue 37; CUDA text):
attention_mma_forward_wg.py's online softmax and overlap (the same 128-query x 64-key tile as
shipped), with Q as well as K and V read by the tensor cores from 128-byte-swizzled shared memory
(no A fragments of Q in registers: 110 registers, two blocks a multiprocessor), the K/V ring
filled by the copy engine (cp.async.bulk) and signalled by mbarriers instead of a block barrier a
tile, and query tiles counted from the last row back. attention_mma.py compiles it beside the
forward it replaces, as flash_mma_forwardwg_<format>_64, where CONFIG["forward_wg"] asks, and
runs it from CONFIG["forward_wg_from"] on; K and V come from the convert with their rows already
swizzled (tiles.py's to_rows, SW), so a tile is one linear copy.
"""


def wgq_entries(fmt: str, d: int, tile: tuple, conv: str, fwd: str) -> str:
    """The module's entries of this forward (`tile`: CONFIG["forward_wg"]'s (warps, keys, stages,
    blocks a multiprocessor)): the convert with rows swizzled, the forward (registers capped for
    those blocks; its last argument B·H); conv, fwd: what attention_mma.py's entries pass."""
    f16, (w, n, nb, blocks) = int(fmt == "fp16"), tile
    return (f'extern "C" __global__ void flash_mma_convertsw_{fmt}_{d}(MMA_CONVERT_ARGS) '
            f"{{ to_rows<{f16}, {d}, 1>({conv}); }}\n"
            f'extern "C" __global__ __launch_bounds__({32 * w}, {blocks}) void flash_mma_forwardwg_{fmt}_{d}('
            f"MMA_FORWARD_ARGS, int bhs) {{ mma_forward_wgq<{f16}, {w}, {n}, {nb}>({fwd}, bhs); }}\n")


def wgq_shared(tile: tuple, d: int) -> int:
    """A block's dynamic shared memory: 1 KiB to align; Q's swizzled rows; the stages of K, V; two
    mbarriers a stage."""
    w, n, nb, _ = tile
    return 1024 + 16 * w * d * 2 + nb * 2 * n * d * 2 + 2 * nb * 8


KERNELS_WGQ = r"""
// mbarriers (shared memory, 8 bytes): the copy engine's bytes and the warps' arrivals.
__device__ __forceinline__ void mbar_init(unsigned long long* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(sm(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(sm(bar)) : "memory");
}
__device__ __forceinline__ void mbar_expect(unsigned long long* bar, int bytes) {  // arrive + bytes due
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(sm(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, int parity) {  // that phase done
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(sm(bar)), "r"(parity) : "memory");
    } while (!done);
}
// bytes from global to shared memory by the copy engine, counted on bar's transaction bytes.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, int bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(sm(dst)), "l"(src), "r"(bytes), "r"(sm(bar)) : "memory");
}
// n rows from row `first` of x (float32, strided), rounded, into a 64-wide 128-byte-swizzled tile
// (tile_sw128's layout), zeros outside [0, T): generic stores, fenced before the tensor cores read them.
// keep (not null): the rows in [0, T) also stored there, the head's plain (Tp, 64) rows (own_rows').
template <int F16, int NTH> __device__ __forceinline__ void rows_sw(
        half_t* dst, const float* x, Strides s, int b, int h, int first, int n, int T, half_t* keep) {
    for (int i = threadIdx.x; i < n * 16; i += NTH) {
        int j = i >> 4, c = (i & 15) * 4;
        bool in = (unsigned)(first + j) < (unsigned)T;
        float4 v = in ? *(const float4*)(row_at(x, s, b, h, first + j) + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        uint2 r = make_uint2(pack<F16>(v.x, v.y), pack<F16>(v.z, v.w));
        *(uint2*)(dst + j * 64 + ((((c >> 3) ^ (j & 7)) << 3) | (c & 7))) = r;
        if (keep && in) *(uint2*)(keep + (long long)(first + j) * 64 + c) = r;
    }
}
// Tile j (of those whose stage sequence number, counted over the block's work, is g) of an item
// into stage g % NB, once the stage's last tile is released (every warp arrived on `empty`): the
// callers wait, `issue` (thread 0) issues the two bulk copies.
template <int N, int NB> __device__ __forceinline__ void wgq_fill(
        half_t* kv, const half_t* kb, const half_t* vb, int j, int g, unsigned long long* full,
        unsigned long long* empty, bool issue) {
    enum { TILE = N * 64, BYTES = TILE * 2 };
    int k = g % NB;
    if (g >= NB) mbar_wait(empty + k, (g / NB + 1) & 1);
    if (issue) {
        mbar_expect(full + k, 2 * BYTES);
        bulk_copy(kv + k * 2 * TILE, kb + (long long)j * TILE, BYTES, full + k);
        bulk_copy(kv + k * 2 * TILE + TILE, vb + (long long)j * TILE, BYTES, full + k);
    }
}
// O by the online softmax (D 64 only): W / 4 warpgroups of 64 query rows a block, N (64) -key
// tiles, NB stages of K, V. S = Q Kᵀ with both operands from shared memory (Q rounded
// into a swizzled tile once an item), O += P V with P in registers, each warpgroup overlapping
// the softmax of tile j with P_{j-1} V_{j-1} as mma_forward_wg. Thread 0 issues a stage's two
// bulk copies (rows swizzled by the convert: each copy lands as the layout the descriptors read)
// on its `full` mbarrier; each warp arrives on the stage's `empty` one once its products reading
// the stage are done, and warpgroup 0 waits on that before thread 0 fills the stage again with the
// tile AHEAD of the one in hand (no block barrier in the loop over tiles). The whole
// warpgroup waits: where thread 0 alone did (round 13), ptxas serialized every wgmma (C7520:
// "program dependence on compiler-inserted WG.AR in divergent path"; round 14's trace,
// benchmarks/r14_c7520.py). A warp past its warpgroup's last tile still waits for each tile and
// arrives, so that every tile is released by all W warps. Work items: (head, query tile), query
// tiles counted from the last row back (the tile cut short, with rows before 0, is the shortest
// causal one; a warpgroup with no row in [0, T) skips every product), the longest causal tiles of
// every head first; block i takes items i, i + grid, ... (a block an item as launched: a
// persistent grid, each block walking many, measured slower in round 13), the ring's phases
// counted on over a block's items (g), an item's first tiles issued once their stages are free.
template <int F16, int W, int N, int NB>
__device__ __forceinline__ void mma_forward_wgq(MMA_FORWARD_ARGS, int bhs) {
    static_assert(N == 64, "S = Q Kᵀ is wgmma's m64n64: 64-key tiles");
    // AHEAD: the tile filled while tile j is in hand is j + AHEAD, into the stage of tile j + AHEAD -
    // NB (with 4 stages, one released a tile ago: warpgroup 0 seldom waits for warpgroup 1)
    enum { HD = 64, M = 16 * W, NTH = 32 * W, NT = N / 8, DT = HD / 8, TILE = N * HD,
           AHEAD = NB > 3 ? 2 : NB - 1 };
    S_(sq); S_(so);
    extern __shared__ __align__(16) half_t smem[];
    // the swizzle reads address bits 7-9 as the row: tiles 1024-byte aligned (the launch adds 1 KiB)
    half_t* qs = smem + (((1024u - (sm(smem) & 1023u)) & 1023u) >> 1);
    half_t* kv = qs + M * HD;  // NB x [K tile; V tile]
    unsigned long long *full = (unsigned long long*)(kv + NB * 2 * TILE), *empty = full + NB;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int wg = __shfl_sync(FULL, threadIdx.x >> 7, 0);
    int items = bhs * ((T + M - 1) / M), base = 0;  // bhs: B·H; base: the ring's tiles before this item
    if (threadIdx.x == 0) {
        for (int i = 0; i < NB; ++i) {
            mbar_init(full + i, 1);
            mbar_init(empty + i, W);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        int bh = item % bhs, b = bh / heads, h = bh % heads;
        int q0 = T - (item / bhs + 1) * M, w0 = q0 + warp * 16, last = q0 + wg * 64 + 63;
        const half_t *kb = kr + (long long)bh * Sp * HD, *vb = vr + (long long)bh * Sp * HD;
        int tiles = ((causal ? min(S, q0 + M) : S) + N - 1) / N;
        int mine = last < 0 ? -1 : causal ? min(tiles, (min(S, last + 1) + N - 1) / N) : tiles;
        if (threadIdx.x == 0)
            for (int i = 0; i < NB && i < tiles; ++i)
                wgq_fill<N, NB>(kv, kb, vb, i, base + i, full, empty, true);
        __syncthreads();  // every warpgroup past the last item's products (they read Q)
        half_t* keep = qk ? qk + (long long)bh * Tp * HD : qk;
        rows_sw<F16, NTH>(qs, q, sq, b, h, q0, M, T, keep);
        if (keep && q0 + M == T)  // the head's last tile: the kept rows' zeros past T too
            for (int i = threadIdx.x; i < (Tp - T) * 16; i += NTH)
                *(uint2*)(keep + (long long)T * HD + i * 4) = make_uint2(0u, 0u);
        async_proxy_fence();  // Q's stores seen by the tensor cores
        __syncthreads();
        float c = scale * LOG2E, m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f}, acc[DT][4], alpha[2];
        unsigned pf[NT / 2][4];
        unsigned long long qd = sw128(qs + wg * 64 * HD), vd = 0;  // vd: the V tile of the product to issue
#pragma unroll
        for (int i = 0; i < DT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
        for (int j = 0; j < tiles; ++j) {
            int stage = (base + j) % NB;
            const half_t* ks = kv + stage * 2 * TILE;
            mbar_wait(full + stage, ((base + j) / NB) & 1);
            if (j < mine) {
                float s[NT][4];  // the first product writes S (add 0): no zeros first
                wg_hold<NT>(s);
                wg_hold<DT>(acc);
                wg_fence();
#pragma unroll
                for (int kc = 0; kc < HD / 16; ++kc)  // 16 columns of D: 32 bytes along each row
                    wgmma_ss<F16, 0, 0>(&s[0][0], qd + 2 * kc, sw128(ks) + 2 * kc, kc);
                wg_commit();
                if (j > 0) {  // P_{j-1} V_{j-1}, still running through the softmax
                    wg_pv<F16>(acc, pf, vd);
                    wg_commit();
                    wg_wait<1>();
                } else {
                    wg_wait<0>();
                }
                wg_hold<NT>(s);
                unsigned pn[NT / 2][4];
                bool moved = wg_softmax<F16, 1, NT>(s, m, l, alpha, pn, c, j * N, w0, S, causal);
                wg_rescale(acc, pf, pn, alpha, moved);
                vd = sw128(ks + TILE);
            } else if (j == mine) {  // this warpgroup's last P V
                wg_last_pv<F16>(acc, pf, vd);
            }
            if (j > 0 && lane == 0) mbar_arrive(empty + (base + j - 1) % NB);  // done with tile j - 1
            if (wg == 0 && j + AHEAD >= NB && j + AHEAD < tiles)  // a warpgroup-uniform branch
                wgq_fill<N, NB>(kv, kb, vb, j + AHEAD, base + j + AHEAD, full, empty, threadIdx.x == 0);
            __syncwarp();
        }
        if (mine == tiles) wg_last_pv<F16>(acc, pf, vd);
        if (lane == 0) mbar_arrive(empty + (base + tiles - 1) % NB);  // the item's last tile
        __syncwarp();
        base += tiles;
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            int row = w0 + g + x * 8;
            float sum = quad_sum(l[x]);
            if (row < 0) continue;
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
}
"""

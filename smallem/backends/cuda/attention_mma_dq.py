"""How the tensor-core attention's key kernels add dQ (CUDA text, round 10, issue 37; attention_mma.py
puts it before attention_mma_grad.py's and _grad2d.py's kernels, CONFIG["dq"] picks the way): every key
block adds its partial dQ tile to dQ, so L2 sees T / 64 additions of every query row at D 64.
"""

KERNELS_DQ = r"""
// A warp's partial dQ (MT m-tiles of 16 query rows from row r0, NT n-tiles of 8 columns from column
// c0 of the head's rows; float32 accumulators, times `scale` here) added to dz (zeroed before), rows
// at or past T left out. DQA (CONFIG["dq"]):
// (all three sm_90's, as the float2 atomicAdd already was)
//   0: float2 atomics (rounds 7-9): 16 instructions a thread for a 16 × 64 tile;
//   1: red.global.add.v4.f32: neighbouring threads swap a pair so that each holds 4 columns
//      of one row: half the atomic instructions, each twice as wide;
//   2: the partial stored in the warp's float32 stage in shared memory ([16·MT][8·NT + 8]: the 8
//      rows of a store fall in distinct banks), then a bulk reduce-add a row from it
//      (cp.reduce.async.bulk ... .add.f32, TMA's, as FlashAttention-3 adds dQ): L2 adds whole
//      lines, not pairs. The stage is read asynchronously: a warp waits for its last reads before
//      writing it again (a tile later: they are long done) and dq_drain waits for all at the end.
template <int DQA, int MT, int NT> __device__ __forceinline__ void dq_add(
        float (*c)[NT][4], float* dz, Strides s, int b, int h, int r0, int c0, int T, float scale,
        float* stage) {
    int lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
    if (DQA == 1) {
        bool odd = t & 1;  // even threads keep row gi, odd ones row gi + 8
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int i = 0; i < NT; ++i) {
                float* x = c[m][i];
                float o0 = __shfl_xor_sync(FULL, odd ? x[0] : x[2], 1);
                float o1 = __shfl_xor_sync(FULL, odd ? x[1] : x[3], 1);
                float4 v = odd ? make_float4(o0, o1, x[2], x[3]) : make_float4(x[0], x[1], o0, o1);
                int row = r0 + m * 16 + gi + (odd ? 8 : 0);
                if (row >= T) continue;
                float* at = (float*)row_at(dz, s, b, h, row) + c0 + i * 8 + (t & 2) * 2;
                asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(at),
                             "f"(v.x * scale), "f"(v.y * scale), "f"(v.z * scale), "f"(v.w * scale)
                             : "memory");
            }
    } else if (DQA == 2) {
        enum { SP = 8 * NT + 8 };
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // the stage's last rows read
        __syncwarp();
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int x = 0; x < 2; ++x)
#pragma unroll
                for (int i = 0; i < NT; ++i)
                    *(float2*)(stage + (m * 16 + gi + x * 8) * SP + i * 8 + t * 2) =
                        make_float2(c[m][i][2 * x] * scale, c[m][i][2 * x + 1] * scale);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the stores seen by the copies
        __syncwarp();
        for (int r = lane; r < 16 * MT; r += 32)
            if (r0 + r < T)
                asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                             :: "l"(row_at(dz, s, b, h, r0 + r) + c0), "r"(sm(stage + r * SP)),
                             "r"(32 * NT) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    } else {  // float2 atomics
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                int row = r0 + m * 16 + gi + x * 8;
                if (row >= T) continue;
                float* op = (float*)row_at(dz, s, b, h, row) + c0;
#pragma unroll
                for (int i = 0; i < NT; ++i)
                    atomicAdd((float2*)(op + i * 8 + t * 2),
                              make_float2(c[m][i][2 * x] * scale, c[m][i][2 * x + 1] * scale));
            }
    }
}
// The end of a key kernel that added dQ by bulk reduces: every one done (the stage may not be
// freed while read) and its writes ordered before what follows (dQ's copy tail reads them).
template <int DQA> __device__ __forceinline__ void dq_drain() {
    if (DQA == 2) asm volatile("cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;" ::: "memory");
}
"""

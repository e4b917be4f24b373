"""How the tensor-core attention's key kernels add dQ (CUDA text; attention_mma.py puts it before
attention_mma_grad.py's, _grad2d.py's and _grad_wg.py's kernels): every key block adds its partial dQ
tile to dQ, so L2 sees T / 64 additions of every query row at D 64.
"""

KERNELS_DQ = r"""
// A warp's partial dQ (MT m-tiles of 16 query rows from row r0, NT n-tiles of 8 columns from column
// c0 of the head's rows; float32 accumulators, times `scale` here) added to dz (zeroed before) by
// float2 atomics (sm_90's), rows at or past T left out. Round 10 measured two other ways and removed
// them in round 11 (results/round10/attention_bwd.md): red.global.add.v4.f32 (slower at D 64) and
// TMA's bulk reduce-adds from a float32 stage in shared memory (L2 63 -> 50 % busy, keyq's time the
// same: the kernel waits on latency, not on the atomics).
template <int MT, int NT> __device__ __forceinline__ void dq_add(
        float (*c)[NT][4], float* dz, Strides s, int b, int h, int r0, int c0, int T, float scale) {
    int gi = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
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
"""

"""Sums over rows on the GPU: a bias gradient's column sums and a fixed-order mean.

Both add in a fixed order, so a result is the same at every run (unlike atomics). cupy.py's
`sum` over the first dimension and the fused add and LayerNorm rules call `column_sums`.
"""

from __future__ import annotations

from typing import Any

from .common import F32, HEADER, _empty, kernel

SOURCE = HEADER + r"""
// out[c] = sum over r of x[r, c]: the bias gradient. A block owns 32 columns; its 32 rows of
// threads stride down them (reads stay coalesced), then add their partial sums in a fixed
// order, so the result is the same at every run.
extern "C" __global__ void column_sum(const float* x, float* out, long long rows, long long cols) {
    __shared__ float partial[32][33];
    long long c = blockIdx.x * 32LL + threadIdx.x;
    float acc = 0.f;
    if (c < cols)
        for (long long r = threadIdx.y; r < rows; r += 32) acc += x[r * cols + c];
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float total = 0.f;
        for (int k = 0; k < 32; ++k) total += partial[k][threadIdx.x];
        out[c] = total;
    }
}

// The first pass of a long column sum: block (x, y) sums rows [y·chunk, (y+1)·chunk) of its 32
// columns into out[y, c]; column_sum then adds the chunks. Each pass in a fixed order.
extern "C" __global__ void column_sum_chunks(const float* x, float* out, long long rows,
                                             long long cols, long long chunk) {
    __shared__ float partial[32][33];
    long long c = blockIdx.x * 32LL + threadIdx.x;
    long long start = blockIdx.y * chunk;
    long long stop = start + chunk < rows ? start + chunk : rows;  // no min(): NVRTC may lack it
    float acc = 0.f;
    if (c < cols)
        for (long long r = start + threadIdx.y; r < stop; r += 32) acc += x[r * cols + c];
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float total = 0.f;
        for (int k = 0; k < 32; ++k) total += partial[k][threadIdx.x];
        out[blockIdx.y * cols + c] = total;
    }
}

// out = mean of x[0..n): one block of 1024 threads, each a strided partial sum, then the
// warps' and the block's sums in a fixed order (the same result at every run).
extern "C" __global__ void mean_of(const float* x, float* out, long long n) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float acc = 0.f;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
    acc = warp_sum(acc);
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        float v = lane < warps ? partial[lane] : 0.f;
        v = warp_sum(v);
        if (lane == 0) *out = v / n;
    }
}
"""

CHUNK_ROWS = 128  # rows a block of column_sum_chunks adds: 4,096 rows make 32 chunks


def column_sums(x: Any, out: Any, rows: int, cols: int) -> None:
    """out[c] = Σ_r x[r, c] for a contiguous float32 x read as (rows, cols), in a fixed order.
    Up to 2·CHUNK_ROWS rows, one launch (the MLP's bias gradients); beyond, the rows are cut in
    chunks first, or a handful of blocks would walk thousands of rows each."""
    grid = (cols + 31) // 32
    if rows <= 2 * CHUNK_ROWS:
        kernel(SOURCE, "column_sum")((grid,), (32, 32), (x, out, rows, cols))
        return
    chunks = (rows + CHUNK_ROWS - 1) // CHUNK_ROWS
    partial = _empty((chunks, cols), F32)
    kernel(SOURCE, "column_sum_chunks")((grid, chunks), (32, 32),
                                        (x, partial, rows, cols, CHUNK_ROWS))
    kernel(SOURCE, "column_sum")((grid,), (32, 32), (partial, out, chunks, cols))


def mean_of(x: Any, out: Any, n: int) -> None:
    """out (a scalar) = the mean of x's first n elements, in a fixed order, one launch."""
    kernel(SOURCE, "mean_of")((1,), (1024,), (x, out, n))

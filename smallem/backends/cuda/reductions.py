"""Sums over rows on the GPU: a bias gradient's column sums and a fixed-order mean.

Both add in a fixed order, so a result is the same at every run (unlike atomics). cupy.py's
`sum` over the first dimension, the Linear's rule and the fused add and LayerNorm rules call
`column_sums`; a width that is a multiple of 4 takes the wide kernel (float4 reads, four loads in
flight per thread), the others the 32-column one.
"""

from __future__ import annotations

import weakref
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

// The wide first pass: a thread owns 4 adjacent columns (one float4 read, 16 bytes), a block
// 128 columns × 8 rows of threads; block (x, y) sums rows [y·chunk, (y+1)·chunk) into
// out[y, c]. Each thread keeps four sums (rows r, r+8, r+16, r+24 of every 32) so four reads are
// in flight at once: the first pass was bound by the latency of one read at a time, at about
// half of DRAM's rate (round 8, 8 × 512: 66 launches, 27 µs each). A fixed order throughout.
__device__ __forceinline__ void add4(float4& a, const float4 b) {
    a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
}
extern "C" __global__ void column_sum4_chunks(const float4* x, float4* out, long long rows,
                                              long long cols4, long long chunk) {
    __shared__ float4 partial[8][32];
    long long c = blockIdx.x * 32LL + threadIdx.x;
    long long start = blockIdx.y * chunk;
    long long stop = start + chunk < rows ? start + chunk : rows;
    float4 s0 = make_float4(0.f, 0.f, 0.f, 0.f), s1 = s0, s2 = s0, s3 = s0;
    if (c < cols4) {
        long long r = start + threadIdx.y;
        for (; r + 24 < stop; r += 32) {
            float4 a = x[r * cols4 + c], b = x[(r + 8) * cols4 + c];
            float4 d = x[(r + 16) * cols4 + c], e = x[(r + 24) * cols4 + c];
            add4(s0, a); add4(s1, b); add4(s2, d); add4(s3, e);
        }
        if (r < stop) add4(s0, x[r * cols4 + c]);
        if (r + 8 < stop) add4(s1, x[(r + 8) * cols4 + c]);
        if (r + 16 < stop) add4(s2, x[(r + 16) * cols4 + c]);
    }
    add4(s0, s1); add4(s2, s3); add4(s0, s2);
    partial[threadIdx.y][threadIdx.x] = s0;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols4) {
        float4 total = partial[0][threadIdx.x];
        for (int k = 1; k < 8; ++k) add4(total, partial[k][threadIdx.x]);
        out[blockIdx.y * cols4 + c] = total;
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
# False: every column sum takes the 32-column kernels (round 7's path, to compare against)
WIDE = True
WIDE_BLOCKS = 528  # the wide pass's target grid: 4 blocks of 256 threads on each of 132 SMs


def column_sums(x: Any, out: Any, rows: int, cols: int) -> None:
    """out[c] = Σ_r x[r, c] for a contiguous float32 x read as (rows, cols), in a fixed order.
    Up to 2·CHUNK_ROWS rows, one launch (the MLP's bias gradients); beyond, the rows are cut in
    chunks first, or a handful of blocks would walk thousands of rows each."""
    if WIDE and cols % 4 == 0 and x.data.ptr % 16 == 0 and out.data.ptr % 16 == 0 and rows:
        _wide(x, out, rows, cols)
        return
    grid = (cols + 31) // 32
    if rows <= 2 * CHUNK_ROWS:
        kernel(SOURCE, "column_sum")((grid,), (32, 32), (x, out, rows, cols))
        return
    chunks = (rows + CHUNK_ROWS - 1) // CHUNK_ROWS
    partial = _empty((chunks, cols), F32)
    kernel(SOURCE, "column_sum_chunks")((grid, chunks), (32, 32),
                                        (x, partial, rows, cols, CHUNK_ROWS))
    kernel(SOURCE, "column_sum")((grid,), (32, 32), (partial, out, chunks, cols))


def wide_chunks(rows: int, cols: int) -> tuple[int, int]:
    """(chunk, chunks) of the wide pass: enough blocks to fill the GPU (WIDE_BLOCKS), each
    chunk a multiple of 32 rows (8 rows of threads × 4 sums), at least 64 rows a chunk."""
    groups = _ceil(cols // 4, 32)
    chunks = max(1, min(_ceil(WIDE_BLOCKS, groups), _ceil(rows, 64)))
    chunk = _ceil(_ceil(rows, chunks), 32) * 32
    return chunk, _ceil(rows, chunk)


def _ceil(a: int, b: int) -> int:
    return (a + b - 1) // b


def _wide(x: Any, out: Any, rows: int, cols: int) -> None:
    """The wide pass into out (one chunk), or into partial sums that the 32-column kernel adds."""
    chunk, chunks = wide_chunks(rows, cols)
    groups = _ceil(cols // 4, 32)
    target = out if chunks == 1 else _empty((chunks, cols), F32)
    kernel(SOURCE, "column_sum4_chunks")((groups, chunks), (32, 8),
                                         (x, target, rows, cols // 4, chunk))
    if chunks > 1:
        kernel(SOURCE, "column_sum")(((cols + 31) // 32,), (32, 32), (target, out, chunks, cols))


def mean_of(x: Any, out: Any, n: int) -> None:
    """out (a scalar) = the mean of x's first n elements, in a fixed order, one launch."""
    kernel(SOURCE, "mean_of")((1,), (1024,), (x, out, n))


# Column sums an array's producer made on the way (GELU's rule sums da as it writes it: gelu.py),
# keyed by the array's memory as halves.py keys 16-bit copies, for as long as the array lives;
# the Linear's rule takes its bias gradient from here when it is there (linear.weight_grads).
_kept: dict[int, tuple[Any, int, Any]] = {}


def keep_sums(owner: Any, sums: Any) -> None:
    """`sums` holds owner's column sums (owner read as (rows, sums.size)) while owner lives."""
    key = owner.data.ptr

    def gone(_: Any, key: int = key, sums: Any = sums) -> None:
        entry = _kept.get(key)
        if entry is not None and entry[2] is sums:
            del _kept[key]

    _kept[key] = (weakref.ref(owner, gone), owner.size, sums)


def kept_sums(x: Any, cols: int) -> Any | None:
    """The column sums x's producer kept (x read as (rows, cols)), or None."""
    entry = _kept.get(x.data.ptr)
    if entry is None or entry[1] != x.size or entry[2].size != cols or entry[0]() is not x:
        return None
    return entry[2]

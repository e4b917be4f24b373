"""The CUDA source of the GPU backend's own kernels, compiled once per process by CuPy.

cupy.py calls these through `launch`. Each kernel is small and reads contiguous float32 arrays
(a RawKernel ignores strides) and int64 indices. Every size is a `long long`, passed as a Python
int (CuPy passes those as 64 bits); every scalar is a `float`, passed as np.float32 (CuPy would
pass a Python float as a double).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

BLOCK = 256
MAX_BLOCKS = 8192  # a grid-stride loop covers the rest: launches stay cheap for huge arrays

_HEADER = r"""
#define NEG_INF __int_as_float(0xff800000)
#define NAN_F __int_as_float(0x7fc00000)
#define GRID_STRIDE(i, n) \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
    return v;
}
// One row of logits, read by the 32 lanes of a warp: its max m and s = sum of exp(x − m),
// the same in every lane. Subtracting the max keeps exp finite for logits of ±1e4.
__device__ __forceinline__ void row_max_sum(const float* x, int classes, int lane, float* m,
                                            float* s) {
    float mx = NEG_INF;
    for (int j = lane; j < classes; j += 32) mx = fmaxf(mx, x[j]);
    mx = warp_max(mx);
    float sum = 0.f;
    for (int j = lane; j < classes; j += 32) sum += expf(x[j] - mx);
    *m = mx;
    *s = warp_sum(sum);
}
"""

HEADER = _HEADER  # for the kernels of other modules (cupy_attention.py)

# Elementwise: y = f(a) and c = a ∘ b, where b is a trailing block of a's shape (same shape,
# a bias row, a scalar array): b's index is i % nb. Scalars come as a float argument.
UNARY = {"neg": "-a", "exp": "expf(a)", "log": "logf(a)", "sqrt": "sqrtf(a)",
         "tanh": "tanhf(a)", "square": "a * a", "abs": "fabsf(a)",
         "relu": "a < 0.f ? 0.f : a",  # NaN passes through, as with NumPy's maximum
         # 1/(1 + e⁻ᵃ) or eᵃ/(1 + eᵃ): the small tail keeps its relative precision
         "sigmoid": "a >= 0.f ? 1.f / (1.f + expf(-a)) : expf(a) / (1.f + expf(a))"}
BINARY = {"add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b"}

_ELEMENTWISE = "".join(
    f"""
extern "C" __global__ void unary_{name}(const float* x, float* y, long long n) {{
    GRID_STRIDE(i, n) {{ float a = x[i]; y[i] = {expr}; }}
}}""" for name, expr in UNARY.items()) + "".join(
    f"""
extern "C" __global__ void binary_{name}(const float* x, const float* z, float* y,
                                         long long n, long long nz) {{
    GRID_STRIDE(i, n) {{ float a = x[i], b = z[i % nz]; y[i] = {expr}; }}
}}
extern "C" __global__ void binary_{name}_scalar_b(const float* x, float b, float* y, long long n) {{
    GRID_STRIDE(i, n) {{ float a = x[i]; y[i] = {expr}; }}
}}
extern "C" __global__ void binary_{name}_scalar_a(float a, const float* z, float* y, long long n) {{
    GRID_STRIDE(i, n) {{ float b = z[i]; y[i] = {expr}; }}
}}""" for name, expr in BINARY.items())

_KERNELS = _HEADER + _ELEMENTWISE + r"""
// tanh's rule, da = dc·(1 − c²), in one launch where the rule's primitives take three.
extern "C" __global__ void tanh_backward(const float* g, const float* c, float* out, long long n) {
    GRID_STRIDE(i, n) { float t = c[i]; out[i] = g[i] * (1.f - t * t); }
}

extern "C" __global__ void fill(float* y, float value, long long n) {
    GRID_STRIDE(i, n) y[i] = value;
}

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

// out[i, :] = table[rows[i], :]; an index outside the table gives NaN rather than a stray read.
extern "C" __global__ void gather_rows(const float* table, const long long* rows, float* out,
                                       long long n, long long width, long long table_rows) {
    GRID_STRIDE(i, n) {
        long long r = rows[i / width];
        out[i] = (r >= 0 && r < table_rows) ? table[r * width + i % width] : NAN_F;
    }
}

// out[rows[i], :] += values[i, :]. A row index may repeat (a byte seen three times in a batch):
// threads then add into the same cell, and only an atomic add keeps every contribution.
extern "C" __global__ void scatter_add_rows(const float* values, const long long* rows,
                                            float* out, long long n, long long width,
                                            long long out_rows) {
    GRID_STRIDE(i, n) {
        long long r = rows[i / width];
        if (r >= 0 && r < out_rows) atomicAdd(out + r * width + i % width, values[i]);
    }
}

// loss = mean over rows of logsumexp(x) − x[target]. One block: each warp takes rows in turn
// (max, then the sum of exponentials, both across its 32 lanes), then the warps' sums are
// added in a fixed order. One launch, no atomics, no zeroing.
extern "C" __global__ void cross_entropy_forward(const float* logits, const long long* targets,
                                                 float* loss, long long n_rows,
                                                 long long n_classes) {
    int rows = (int)n_rows, classes = (int)n_classes;
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float acc = 0.f;
    for (int r = warp; r < rows; r += warps) {
        const float* x = logits + (long long)r * classes;
        float m, s;
        row_max_sum(x, classes, lane, &m, &s);
        acc += m + logf(s) - x[targets[r]];  // the same in every lane: lane 0's copy is kept
    }
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        float v = lane < warps ? partial[lane] : 0.f;
        v = warp_sum(v);
        if (lane == 0) *loss = v / rows;
    }
}

// Many rows (a Transformer's B·T): one warp per row writes its loss, then mean_of adds them
// in a fixed order. One block for all rows (above) would leave the GPU nearly idle.
extern "C" __global__ void cross_entropy_rows(const float* logits, const long long* targets,
                                              float* row_loss, long long rows,
                                              long long n_classes) {
    int classes = (int)n_classes;
    int lane = threadIdx.x & 31;
    long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) return;
    const float* x = logits + r * classes;
    float m, s;
    row_max_sum(x, classes, lane, &m, &s);
    if (lane == 0) row_loss[r] = m + logf(s) - x[targets[r]];
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

// d logits = (softmax(x) − onehot(target)) · grad / rows, one warp per row.
extern "C" __global__ void cross_entropy_backward(const float* logits, const long long* targets,
                                                  const float* grad, float* out,
                                                  long long rows, long long n_classes) {
    int classes = (int)n_classes;
    int lane = threadIdx.x & 31;
    long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) return;  // whole warps leave together: the shuffles below stay full
    const float* x = logits + r * classes;
    float* y = out + r * classes;
    float m, s;
    row_max_sum(x, classes, lane, &m, &s);
    float scale = grad[0] / rows, inv = 1.f / s;
    long long t = targets[r];
    for (int j = lane; j < classes; j += 32)
        y[j] = (expf(x[j] - m) * inv - (j == t ? 1.f : 0.f)) * scale;
}
"""

# Optimizers over several tensors in one launch: slot k owns flat indices [end(k−1), end(k)).
_OPTIMIZER_HEADER = _HEADER + r"""
// bc1 = 1 − β1ᵗ and bc2 = 1 − β2ᵗ belong to the slot: each parameter counts its own steps t.
__device__ __forceinline__ void adamw_one(float* p, const float* g, float* m, float* v,
        long long i, float wd, float bc1, float bc2, float lr, float b1, float c1, float b2,
        float c2, float eps) {
    float gi = g[i];
    float mi = b1 * m[i] + c1 * gi;       // c1 = 1 − β1
    float vi = b2 * v[i] + c2 * gi * gi;  // c2 = 1 − β2
    m[i] = mi;
    v[i] = vi;
    float update = (mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p[i];
    p[i] -= lr * update;
}
"""


def _slots(k: int, fields: str) -> str:
    return ", ".join(fields.format(j=j) for j in range(k))


def _dispatch(k: int, call: str) -> str:
    lines = []
    for j in range(k):
        start = "0" if j == 0 else f"e{j - 1}"
        lines.append(f"        {'if' if j == 0 else 'else if'} (i < e{j}) "
                     + call.format(j=j, start=start) + ";")
    return "\n".join(lines)


_ADAMW_SLOT = ("float* p{j}, const float* g{j}, float* m{j}, float* v{j}, long long e{j}, "
               "float wd{j}{t_arg}")
_ADAMW_CALL = ("adamw_one(p{j}, g{j}, m{j}, v{j}, i - {start}, wd{j}, {bc}, "
               "lr, b1, c1, b2, c2, eps)")


def adamw_source(k: int, device_corrections: bool = False) -> str:
    """AdamW over k tensors. Each parameter's bias corrections come as two float arguments per
    slot, or, for a captured step (`device_corrections`), from a device array (two floats per
    slot) read when the kernel runs: a replayed graph sees each step's own."""
    slot = _ADAMW_SLOT.replace("{t_arg}", "" if device_corrections
                               else ", float bc1_{j}, float bc2_{j}")
    call = _ADAMW_CALL.replace("{bc}", "bc[2 * {j}], bc[2 * {j} + 1]" if device_corrections
                               else "bc1_{j}, bc2_{j}")
    name = f"adamw_dev_{k}" if device_corrections else f"adamw_{k}"
    return _OPTIMIZER_HEADER + f"""
extern "C" __global__ void {name}(
        {_slots(k, slot)},{" const float* bc," if device_corrections else ""}
        float lr, float b1, float c1, float b2, float c2, float eps) {{
    GRID_STRIDE(i, e{k - 1}) {{
{_dispatch(k, call)}
    }}
}}
"""


def sgd_source(k: int) -> str:
    return _HEADER + f"""
extern "C" __global__ void sgd_{k}(
        {_slots(k, "float* p{j}, const float* g{j}, long long e{j}")}, float lr) {{
    GRID_STRIDE(i, e{k - 1}) {{
{_dispatch(k, "p{j}[i - {start}] -= lr * g{j}[i - {start}]")}
    }}
}}
"""


def all_sources() -> dict[str, str]:
    """Every source, for a compile check without a device (tests/test_gpu.py)."""
    out = {"kernels": _KERNELS}
    for k in range(1, 9):
        out[f"adamw_{k}"] = adamw_source(k)
        out[f"adamw_dev_{k}"] = adamw_source(k, device_corrections=True)
        out[f"sgd_{k}"] = sgd_source(k)
    return out


# compiling and launching -------------------------------------------------------------------
@cache
def _module(source: str) -> Any:
    import cupy

    return cupy.RawModule(code=source)


@cache
def function(name: str) -> Any:
    """A kernel of the main module by name (compiled on first use, cached on disk by CuPy)."""
    return _module(_KERNELS).get_function(name)


@cache
def optimizer_function(kind: str, k: int) -> Any:
    """"sgd", "adamw" (bias corrections as arguments) or "adamw_dev" (read from device
    memory) over k tensors."""
    source = {"sgd": sgd_source, "adamw": adamw_source,
              "adamw_dev": lambda k: adamw_source(k, device_corrections=True)}[kind](k)
    return _module(source).get_function(f"{kind}_{k}")


CHUNK_ROWS = 128  # rows a block of column_sum_chunks adds: 4,096 rows make 32 chunks


def column_sums(x: Any, out: Any, rows: int, cols: int) -> None:
    """out[c] = Σ_r x[r, c] for a contiguous float32 x read as (rows, cols), in a fixed order.
    Up to 2·CHUNK_ROWS rows, one launch (the MLP's bias gradients); beyond, the rows are cut in
    chunks first, or a handful of blocks would walk thousands of rows each."""
    grid = (cols + 31) // 32
    if rows <= 2 * CHUNK_ROWS:
        function("column_sum")((grid,), (32, 32), (x, out, rows, cols))
        return
    import cupy

    chunks = (rows + CHUNK_ROWS - 1) // CHUNK_ROWS
    partial = cupy.ndarray((chunks, cols), np.float32)
    function("column_sum_chunks")((grid, chunks), (32, 32), (x, partial, rows, cols, CHUNK_ROWS))
    function("column_sum")((grid,), (32, 32), (partial, out, chunks, cols))


def launch(fn: Any, n: int, args: tuple) -> None:
    """One thread per element (grid-stride beyond MAX_BLOCKS blocks); nothing for n = 0."""
    if n:
        fn((min((n + BLOCK - 1) // BLOCK, MAX_BLOCKS),), (BLOCK,), args)


f32 = np.float32

"""What every kernel file of the GPU room shares: the CUDA header, the one compile cache, the
launch helpers, and the float32 test every fast path makes.

Importable without CuPy (the CPU tests read the sources): `cupy` is then None, and nothing here
is called. A RawKernel ignores strides and takes Python ints as 64 bits and floats as doubles:
sizes are `long long`, scalars `float` passed as np.float32 (`f32`).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

try:
    import cupy
except ImportError:  # the sources and the fused table are still readable (tests, calls.py)
    cupy = None

F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)
f32 = np.float32
BLOCK = 256
MAX_BLOCKS = 8192  # a grid-stride loop covers the rest: launches stay cheap for huge arrays
# cupy.ndarray(shape, dtype) is what cupy.empty calls, one Python frame (~1 µs) less
_empty: Any = cupy.ndarray if cupy is not None else None

HEADER = r"""
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
"""


def fast(a: Any) -> bool:
    """A float32 device array laid out plainly: what the RawKernels can read."""
    return type(a) is _empty and a.dtype == F32 and a._c_contiguous  # flags: ~1 µs more


def strides(x: Any) -> tuple:
    """(b, h, t) strides in floats of a (B, H, T, D) or (N, T, D) array (N: B with one head), as
    the attention kernels read q, k, v and dO through them (the heads' transposes cost no copy)."""
    s = [st // 4 for st in x.strides[:-1]]
    return tuple(np.int64(v) for v in ((s[0], 0, s[1]) if len(x.shape) == 3 else s))


def contiguous(a: Any) -> Any:
    """`a`, or a C-ordered copy of it. Not ascontiguousarray: that makes a 0-d array (a loss, a
    scalar) 1-d."""
    return a if a.flags.c_contiguous else a.copy(order="C")


# the one compile cache ----------------------------------------------------------------------
@cache
def compiled(source: str, arch: str = "") -> Any:
    """One CUDA source compiled into a module (once per process; CuPy also caches on disk);
    `arch` ("sm_90a": the tensor-core attention's wgmma) NVRTC's -arch, else CuPy's own."""
    return cupy.RawModule(code=source, options=(f"-arch={arch}",) if arch else ())


@cache
def kernel(source: str, name: str, arch: str = "") -> Any:
    """The kernel `name` of `source` (each kernel file passes its own SOURCE)."""
    return compiled(source, arch).get_function(name)


def launch(fn: Any, n: int, args: tuple) -> None:
    """One thread per element (grid-stride beyond MAX_BLOCKS blocks); nothing for n = 0."""
    if n:
        fn((min((n + BLOCK - 1) // BLOCK, MAX_BLOCKS),), (BLOCK,), args)


# True: the memory-bound elementwise kernels (GELU and its rule, the adds that write a 16-bit
# copy) read and write four floats a thread (128-bit) on a grid sized to the SMs, where the
# array's size is a multiple of 4 and its pointers 16-byte aligned; False: one float a thread.
VECTORS = True


@cache
def resident_blocks() -> int:
    """Blocks of BLOCK threads the whole GPU holds at once (2,048 threads an SM on Hopper):
    a grid-stride loop over this many keeps every SM full with no tail of late blocks."""
    return cupy.cuda.Device().attributes["MultiProcessorCount"] * (2048 // BLOCK)


def vectored(*xs: Any) -> bool:
    """Whether arrays of this size and alignment take the four-a-thread kernels now."""
    return VECTORS and all(x.size % 4 == 0 and x.data.ptr % 16 == 0 for x in xs)


def launch4(fn: Any, n: int, args: tuple) -> None:
    """One thread per four elements (n of them: the float count), a grid of resident_blocks()
    at most."""
    if n:
        fn((min((n // 4 + BLOCK - 1) // BLOCK, resident_blocks()),), (BLOCK,), args)


def warps(rows: int) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) for a warp per row, BLOCK threads a block."""
    per_block = BLOCK // 32
    return ((rows + per_block - 1) // per_block,), (BLOCK,)

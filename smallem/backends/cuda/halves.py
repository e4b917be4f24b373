"""The 16-bit copies a bf16 or fp16 product reads, made by the kernel that makes the float32 array.

A product in bf16/fp16 (tensor_cores.py) reads 16-bit operands. Rounding both of them in a
launch of its own before every product cost a quarter of a bf16 step, the weights re-rounded at
every use. Instead, the kernels that write a float32 array a product will read (the optimizer
as it updates a weight, LayerNorm, GELU, the head merge, an add, the gradients feeding a
Linear's backward) write its 16-bit copy in the same pass and register it here; the product
looks each operand up and rounds only what nobody registered (`ROUNDINGS` counts those).

A copy is keyed by the float32 memory it mirrors (precision, address, size) and lives as long
as the array that registered it (a weak reference): when that array goes, its memory may be
handed to another, so its copy goes with it. A copy is right only while its float32 array is not
written in place: what registers one is a fresh output nobody writes again, or a parameter,
whose every in-place update (the optimizer kernels) writes the copy too.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from .common import HEADER, _empty, kernel, launch

PRECISIONS = ("bf16", "fp16")  # the formats whose products read 16-bit copies
NO_COPY = np.uint64(0)  # the null pointer a producer kernel gets when no copy is wanted

# float32 -> the 16 bits of bf16 or fp16, to nearest, ties to even (precision.round_to's values)
HALF = r"""
__device__ __forceinline__ unsigned short to_bf16(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7F800000u) == 0x7F800000u) return (u >> 16) | ((u & 0xFFFFu) ? 0x40u : 0u);
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ unsigned short to_fp16(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
// A producer's copy: h is null when no copy is wanted, fp16 picks the format (bf16 otherwise).
__device__ __forceinline__ void put_half(unsigned short* h, long long i, float x, int fp16) {
    if (h) h[i] = fp16 ? to_fp16(x) : to_bf16(x);
}
"""

# Four of them at once, one 8-byte store (elementwise kernels reading float4s): i counts fours.
HALF4 = r"""
__device__ __forceinline__ void put_half4(unsigned short* h, long long i, float4 x, int fp16) {
    if (!h) return;
    ushort4 u;
    u.x = fp16 ? to_fp16(x.x) : to_bf16(x.x); u.y = fp16 ? to_fp16(x.y) : to_bf16(x.y);
    u.z = fp16 ? to_fp16(x.z) : to_bf16(x.z); u.w = fp16 ? to_fp16(x.w) : to_bf16(x.w);
    reinterpret_cast<ushort4*>(h)[i] = u;
}
"""

SOURCE = HEADER + HALF + r"""
// The fallback: x rounded in a launch of its own (an operand no producer made a copy of).
extern "C" __global__ void round_half(const float* x, unsigned short* h, long long n, int fp16) {
    GRID_STRIDE(i, n) h[i] = fp16 ? to_fp16(x[i]) : to_bf16(x[i]);
}
"""

_copies: dict[tuple[str, int], tuple[Any, int, Any]] = {}  # (precision, address) -> entry
ROUNDINGS = [0]  # fallback roundings so far in this process (a test reads it)


def wanted(precision: str) -> bool:
    return precision in PRECISIONS


def fp16_flag(precision: str) -> np.int32:
    return np.int32(precision == "fp16")


def lookup(x: Any, precision: str) -> Any | None:
    """The registered copy of x's memory (x contiguous, or read as stored), or None."""
    entry = _copies.get((precision, x.data.ptr))
    if entry is None or entry[1] != x.size or entry[0]() is None:
        return None
    return entry[2]


def register(owner: Any, half: Any, precision: str) -> None:
    """`half` is the copy of owner's memory for as long as owner lives."""
    key = (precision, owner.data.ptr)

    def gone(_: Any, key: tuple = key, half: Any = half) -> None:
        entry = _copies.get(key)
        if entry is not None and entry[2] is half:
            del _copies[key]

    _copies[key] = (weakref.ref(owner, gone), owner.size, half)


def new_copy(owner: Any, precision: str) -> Any:
    """An empty 16-bit array registered as owner's copy: the caller's kernel fills it now."""
    half = _empty(owner.shape, np.uint16)
    register(owner, half, precision)
    return half


def output_copy(out: Any, precision: str) -> Any:
    """What a producer kernel passes for its output `out`: a new registered copy in a 16-bit
    precision, the null pointer otherwise."""
    return new_copy(out, precision) if precision in PRECISIONS else NO_COPY


def copy_for_update(p: Any, precision: str) -> Any:
    """A parameter's copy for the optimizer kernel to write (kept from update to update), or the
    null pointer: only matrices are read by products."""
    if precision not in PRECISIONS or p.ndim != 2:
        return NO_COPY
    half = lookup(p, precision)
    return half if half is not None else new_copy(p, precision)


def rounded(x: Any, precision: str, keep: bool = False) -> Any:
    """x (contiguous float32) as 16 bits: its registered copy, or rounded now in one launch
    (registered with x as its owner when `keep`: a gradient two products read)."""
    half = lookup(x, precision)
    if half is not None:
        return half
    ROUNDINGS[0] += 1
    half = _empty(x.shape, np.uint16)
    launch(kernel(SOURCE, "round_half"), x.size, (x, half, x.size, fp16_flag(precision)))
    if keep:
        register(x, half, precision)
    return half

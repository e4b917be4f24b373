"""fp16's loss scaler on the device, so that a captured step decides its own skips.

precision.LossScaler reads each step's verdict on the host, which a CUDA graph cannot. Here the
same rule runs in kernels on state in device memory: `find_nonfinite_<k>` flags an inf or NaN in
any gradient, `scaler_step` applies LossScaler.update to the flag (skip and halve, or count and double
after `interval` clean steps), writes the gate the optimizer kernels read (apply?, 1/scale) and the
seed of the next backward, and advances each parameter's AdamW t only on applied steps, with its
1 − βᵗ computed in float64 as AdamW.bias_corrections does.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .common import HEADER, _empty, cupy, kernel, launch
from .optimizers import MAX_SLOTS, _dispatch, _slots

SOURCE = HEADER + r"""
// LossScaler.update on the device. state: [non-finite flag, clean, skipped]; scale in float64 as
// the host keeps it; gate = [apply (1 or 0), 1/scale this step used]; seed = the next backward's
// starting gradient; t, bc: each parameter's AdamW step count and its 1 − β1ᵗ, 1 − β2ᵗ.
extern "C" __global__ void scaler_step(double* scale, float* seed, float* gate, int* state,
                                       int interval, int* t, float* bc, int params,
                                       double beta1, double beta2) {
    int bad = state[0];
    __syncthreads();  // every thread has read the flag before thread 0 clears it
    if (!bad)
        for (int p = threadIdx.x; p < params; p += blockDim.x) {
            int tp = t[p] + 1;
            t[p] = tp;
            bc[2 * p] = (float)(1.0 - pow(beta1, (double)tp));
            bc[2 * p + 1] = (float)(1.0 - pow(beta2, (double)tp));
        }
    if (threadIdx.x == 0) {
        double s = scale[0];
        gate[0] = bad ? 0.f : 1.f;
        gate[1] = (float)(1.0 / s);
        state[0] = 0;
        if (bad) { s = s / 2.0; state[1] = 0; state[2] += 1; }
        else if (++state[1] == interval) { s = s * 2.0; state[1] = 0; }
        scale[0] = s;
        seed[0] = (float)s;
    }
}
"""


def check_source(k: int) -> str:
    """`find_nonfinite_<k>`: state[0] = 1 when any element of k gradients is inf or NaN (slot j owns
    flat indices [e(j−1), e(j)), as in the optimizer kernels; the pointers are arguments, so a
    graph records them as they are). Every writer writes 1: no race that matters."""
    return HEADER + f"""
__device__ __forceinline__ void flag_nonfinite(const float* g, long long i, int* state) {{
    unsigned int u = __float_as_uint(g[i]);
    if ((u & 0x7F800000u) == 0x7F800000u) state[0] = 1;  // exponent all ones: inf or NaN
}}
extern "C" __global__ void find_nonfinite_{k}(
        {_slots(k, "const float* g{j}, long long e{j}")}, int* state) {{
    GRID_STRIDE(i, e{k - 1}) {{
{_dispatch(k, "flag_nonfinite(g{j}, i - {start}, state)")}
    }}
}}
"""


@cache  # the source is built once: writing it costs more than a launch
def check_kernel(k: int) -> Any:
    return kernel(check_source(k), f"find_nonfinite_{k}")


def sources() -> dict[str, str]:
    """Every finite-check source, by kernel name (all_sources() gathers them)."""
    return {f"find_nonfinite_{k}": check_source(k) for k in range(1, MAX_SLOTS + 1)}


class DeviceScaler:
    """A LossScaler's state in device memory, with the parameters' AdamW step counts: `push`
    copies the host's in, `pull` reads it back (each waits for the GPU: call them outside the
    steps), `check` and `decide` are what a captured step records."""

    def __init__(self, params: int) -> None:
        self.scale = cupy.zeros(1, np.float64)
        self.seed = cupy.zeros((), np.float32)  # the backward's seed: a scalar loss's shape
        self.gate = cupy.ones(2, np.float32)
        self.state = cupy.zeros(3, np.int32)
        self.t = cupy.zeros(max(params, 1), np.int32)
        self.corrections = cupy.zeros(2 * max(params, 1), np.float32)
        self.params = params

    def push(self, scale: float, clean: int, skipped: int, t: list[int]) -> None:
        self.scale[...] = scale
        self.seed[...] = np.float32(scale)
        self.state.set(np.array([0, clean, skipped], np.int32))
        if t:
            self.t.set(np.array(t, np.int32))

    def pull(self) -> tuple[float, int, int]:
        """(scale, clean, skipped) as the device has them now."""
        state = self.state.get()
        return float(self.scale.get()[0]), int(state[1]), int(state[2])

    def check(self, grads: list[Any]) -> None:
        """Record: flag an inf or NaN in any of `grads` (contiguous float32), one launch per
        MAX_SLOTS of them."""
        flag_nonfinite(grads, self.state)

    def decide(self, interval: int, beta1: float, beta2: float) -> None:
        """Record: the scaler's update on the flag, the gate, the seed, the counts."""
        kernel(SOURCE, "scaler_step")((1,), (128,), (
            self.scale, self.seed, self.gate, self.state, np.int32(interval), self.t,
            self.corrections, np.int32(self.params), np.float64(beta1), np.float64(beta2)))


def flag_nonfinite(grads: list[Any], state: Any) -> None:
    """state[0] = 1 when any of `grads` (contiguous float32) holds an inf or NaN, one launch per
    MAX_SLOTS of them."""
    grads = [g for g in grads if g.size]
    for start in range(0, len(grads), MAX_SLOTS):
        chunk, args, end = grads[start:start + MAX_SLOTS], [], 0
        for g in chunk:
            end += g.size
            args += [g, end]
        launch(check_kernel(len(chunk)), end, (*args, state))


def all_finite(grads: list[Any]) -> bool | None:
    """The plain fp16 step's verdict (precision.all_finite on the GPU): no inf or NaN in any of
    `grads`, by the finite-check kernels into a flag and one read; None (the generic way) for
    anything but float32. CuPy's isfinite, all and stack, the generic way, are kernels CuPy
    compiles on their first use in a process where its cache lacks them (seconds each)."""
    grads = [g for g in grads if g is not None]
    if any(type(g) is not _empty or g.dtype != np.float32 for g in grads):
        return None
    state = cupy.zeros(1, np.int32)
    flag_nonfinite([as_contiguous(g) for g in grads], state)
    return not int(state.get()[0])


def as_contiguous(g: Any) -> Any:
    """A gradient the check can read by flat index (a broadcast view copied)."""
    if type(g) is _empty and g._c_contiguous:
        return g
    return cupy.ascontiguousarray(g)

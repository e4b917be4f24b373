"""SGD and AdamW on the GPU: every parameter updated in place, up to MAX_SLOTS tensors a launch.

Slot k of a launch owns flat indices [end(k−1), end(k)). AdamW's bias corrections 1 − βᵗ come
as two float arguments per slot, or, in a captured step, from a device array read when the
kernel runs (`adamw_dev_<k>`), so a replayed graph sees each step's own.
Each slot also takes the 16-bit copy a bf16/fp16 product reads of that parameter (halves.py),
written from the new value in the same pass (a null pointer: no copy). A captured fp16 step
passes a `gate` (scaler.py): [apply?, 1/scale], read when the kernel runs (null: apply, as is).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from . import halves
from .common import F32, HEADER, contiguous, cupy, f32, fast, kernel, launch

MAX_SLOTS = 8  # tensors per optimizer launch; more parameters take ceil(n/8) launches

_ADAMW_HEADER = HEADER + halves.HALF + r"""
// bc1 = 1 − β1ᵗ and bc2 = 1 − β2ᵗ belong to the slot: each parameter counts its own steps t.
__device__ __forceinline__ void adamw_one(float* p, const float* g, float* m, float* v,
        unsigned short* h, long long i, float wd, float bc1, float bc2, float lr, float b1,
        float c1, float b2, float c2, float eps, int fp16, float unscale) {
    float gi = g[i] * unscale;  // the loss scale undone (1 without a scaler: the same bits)
    float mi = b1 * m[i] + c1 * gi;       // c1 = 1 − β1
    float vi = b2 * v[i] + c2 * gi * gi;  // c2 = 1 − β2
    m[i] = mi;
    v[i] = vi;
    float update = (mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p[i];
    float pi = p[i] - lr * update;
    p[i] = pi;
    put_half(h, i, pi, fp16);
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


_ADAMW_SLOT = ("float* p{j}, const float* g{j}, float* m{j}, float* v{j}, unsigned short* h{j}, "
               "long long e{j}, float wd{j}{t_arg}")
_ADAMW_CALL = ("adamw_one(p{j}, g{j}, m{j}, v{j}, h{j}, i - {start}, wd{j}, {bc}, "
               "lr, b1, c1, b2, c2, eps, fp16, unscale)")


def adamw_source(k: int, device_corrections: bool = False) -> str:
    """AdamW over k tensors: `adamw_<k>` (corrections as arguments) or `adamw_dev_<k>` (from
    a device array of two floats per slot)."""
    slot = _ADAMW_SLOT.replace("{t_arg}", "" if device_corrections
                               else ", float bc1_{j}, float bc2_{j}")
    call = _ADAMW_CALL.replace("{bc}", "bc[2 * {j}], bc[2 * {j} + 1]" if device_corrections
                               else "bc1_{j}, bc2_{j}")
    name = f"adamw_dev_{k}" if device_corrections else f"adamw_{k}"
    return _ADAMW_HEADER + f"""
extern "C" __global__ void {name}(
        {_slots(k, slot)},{" const float* bc," if device_corrections else ""}
        float lr, float b1, float c1, float b2, float c2, float eps, int fp16, const float* gate) {{
    if (gate && gate[0] == 0.f) return;  // fp16: the scaler skipped this step
    float unscale = gate ? gate[1] : 1.f;
    GRID_STRIDE(i, e{k - 1}) {{
{_dispatch(k, call)}
    }}
}}
"""


def sgd_source(k: int) -> str:
    """SGD over k tensors: `sgd_<k>`, p ← p − lr·g (and its 16-bit copy, where it has one)."""
    return HEADER + halves.HALF + f"""
__device__ __forceinline__ void sgd_one(float* p, const float* g, unsigned short* h, long long i,
                                        float lr, int fp16, float unscale) {{
    float pi = p[i] - lr * (g[i] * unscale);
    p[i] = pi;
    put_half(h, i, pi, fp16);
}}
extern "C" __global__ void sgd_{k}(
        {_slots(k, "float* p{j}, const float* g{j}, unsigned short* h{j}, long long e{j}")},
        float lr, int fp16, const float* gate) {{
    if (gate && gate[0] == 0.f) return;
    float unscale = gate ? gate[1] : 1.f;
    GRID_STRIDE(i, e{k - 1}) {{
{_dispatch(k, "sgd_one(p{j}, g{j}, h{j}, i - {start}, lr, fp16, unscale)")}
    }}
}}
"""


# kind -> (source of k slots, kernel name of k slots): what `optimizer_kernel` compiles
KINDS = {"sgd": (sgd_source, "sgd_{k}"), "adamw": (adamw_source, "adamw_{k}"),
         "adamw_dev": (lambda k: adamw_source(k, device_corrections=True), "adamw_dev_{k}")}


def sources() -> dict[str, str]:
    """Every optimizer source, by kernel name (all_sources() gathers them)."""
    return {name.format(k=k): source(k) for source, name in KINDS.values()
            for k in range(1, MAX_SLOTS + 1)}


@cache  # the source is built once: writing it costs more than a launch
def optimizer_kernel(kind: str, k: int) -> Any:
    """The kernel of `kind` ("sgd", "adamw", "adamw_dev") over k tensors."""
    source, name = KINDS[kind]
    return kernel(source(k), name.format(k=k))


def _operand(x: Any, like: Any) -> Any:
    """`x` as a contiguous float32 device array of like's size (a gradient that came back as a
    broadcast view, say)."""
    if fast(x) and x.size == like.size:
        return x
    return contiguous(cupy.broadcast_to(cupy.asarray(x, F32), like.shape))


def _gate(gate: Any) -> Any:
    return halves.NO_COPY if gate is None else gate  # the null pointer: every update applied


def sgd_update(params: Sequence[Any], grads: Sequence[Any], lr: float, precision: str = "fp32",
               gate: Any = None) -> None:
    """p ← p − lr·g for every parameter, in place, one launch per MAX_SLOTS tensors; in bf16 or
    fp16, each matrix's 16-bit copy written beside it."""
    for start in range(0, len(params), MAX_SLOTS):
        ps, gs = params[start:start + MAX_SLOTS], grads[start:start + MAX_SLOTS]
        args: list[Any] = []
        end = 0
        for p, g in zip(ps, gs):
            end += p.size
            args += [p, _operand(g, p), halves.copy_for_update(p, precision), end]
        launch(optimizer_kernel("sgd", len(ps)), end, (*args, f32(lr), halves.fp16_flag(precision),
                                                       _gate(gate)))


def adamw_update(params: Sequence[Any], grads: Sequence[Any], ms: Sequence[Any],
                 vs: Sequence[Any], *, steps: Sequence[int], lr: float, beta1: float,
                 beta2: float, eps: float, weight_decays: Sequence[float],
                 corrections: Any = None, precision: str = "fp32", gate: Any = None) -> None:
    """AdamW on every parameter at once: p, m and v updated in place, one thread per element
    (in bf16 or fp16, each matrix's 16-bit copy written beside it).
    Each parameter's 1 − βᵗ is computed here from its t, or, with `corrections` (a device
    array of two floats per parameter), read from device memory when the kernel runs."""
    tail = (f32(lr), f32(beta1), f32(1.0 - beta1), f32(beta2), f32(1.0 - beta2), f32(eps),
            halves.fp16_flag(precision), _gate(gate))
    for start in range(0, len(params), MAX_SLOTS):
        chunk = slice(start, start + MAX_SLOTS)
        args: list[Any] = []
        end = 0
        for p, g, m, v, wd, t in zip(params[chunk], grads[chunk], ms[chunk], vs[chunk],
                                     weight_decays[chunk], steps[chunk]):
            for state in (p, m, v):
                if not fast(state):
                    raise ValueError("adamw_update: parameters and moments must be "
                                     "contiguous float32 GPU arrays (updated in place)")
            end += p.size
            args += [p, _operand(g, p), m, v, halves.copy_for_update(p, precision), end, f32(wd)]
            if corrections is None:
                args += [f32(1.0 - beta1 ** t), f32(1.0 - beta2 ** t)]
        k = len(params[chunk])
        if corrections is None:
            launch(optimizer_kernel("adamw", k), end, (*args, *tail))
        else:
            launch(optimizer_kernel("adamw_dev", k), end, (*args, corrections[2 * start:], *tail))

"""The fused attention on the GPU (autodiff/attention.py's Attention): which kernels a pass takes,
and the float32 row kernels' launches (their source: attention_rows.py): one launch forward, the
online softmax a query row at a time; three launches backward as FlashAttention-2's (δ, then dK
and dV a key row at a time, then dQ a query row at a time). FLOAT32 says where attention_f32.py's
tiled kernels (widths 32, 64, 128) take their place (on the tensor cores by 3xTF32 at
attention_f32_tc.TC's and attention_f32_tc_grad.TCB's widths, the backward from its FROM's T);
bf16 and fp16 take the tensor cores' (attention_mma.py). q, k, v and dO read through their
strides, so the heads' transposes cost no copy. They match the tiled reference
(tests/test_attention_fused_gpu.py) or decline.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import attention_f32, attention_f32_tc, attention_f32_tc_grad, attention_mma
from .attention_rows import KERNELS
from .common import F32, HEADER, _empty, kernel
from .common import strides as _strides

WIDTHS = (16, 32, 64, 128)  # head widths D the kernels are compiled for; others decline
# Per width: G threads per row (each holds D / G of q, k, v, the accumulators: 32 numbers at
# most, so four rows of them fit in registers) and ROWS rows per block.
CONFIG = {16: (1, 128), 32: (1, 128), 64: (2, 64), 128: (4, 32)}  # timed: round6/
MAX_HEADS = 65535  # B·H is the grid's second dimension
# The float32 kernels: these "rows" kernels, round 8's "flash" ones (attention_f32.py:
# FlashAttention-2's register tiles) at widths 32, 64, 128, or "auto": flash at the widths where
# they are measured faster (attention_f32.MEASURED). Width 16 always takes the rows. Flash adds
# dQ by atomics, in whatever order the blocks run: its float32 dQ differs between runs by rounding
# (dK, dV and the forward do not). "rows" adds in a fixed order: the deterministic choice.
FLOAT32 = "auto"  # flash checked against float64 on the H200 (results/round8/attention_f32.md)


def source(config: dict[int, tuple[int, int]]) -> str:
    """The CUDA source: for each width d, its kernels flash_<kind>_<d> with config[d]'s
    (G, ROWS); δ's kernel for every width. (A bench may compile another config as SOURCE.)"""
    one = ('extern "C" __global__ void flash_{kind}_{d}({args}) '
           '{{ {kind}<{d}, {g}, {rows}>({names}); }}\n')
    fwd = ("q, k, v, o, lse, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, heads, "
           "T, S, scale, causal")
    grad = ("q, k, v, g, lse, delta, dx, dy, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sgb, sgh, "
            "sgt, sdxb, sdxh, sdxt, sdyb, sdyh, sdyt, heads, T, S, scale, causal")
    out = [HEADER, KERNELS]
    for d, (g, rows) in config.items():
        out.append(one.format(kind="forward", d=d, g=g, rows=rows, args="FORWARD_ARGS",
                              names=fwd))
        for kind in ("key_grads", "query_grads"):
            out.append(one.format(kind=kind, d=d, g=g, rows=rows, args="GRAD_ARGS",
                                  names=grad))
    out += [f'extern "C" __global__ void flash_delta_{d}(DELTA_ARGS) {{ row_delta<{d}>(o, g, delta, '
            "sob, soh, sot, sgb, sgh, sgt, heads, T, rows); }\n" for d in WIDTHS]
    return "".join(out)


SOURCE = source(CONFIG)
_LOADED: dict[tuple[str, int], tuple] = {}  # (SOURCE, width) -> its four kernels


def _kernels(d: int) -> tuple[Any, Any, Any, Any]:
    """(forward, dK dV, dQ, δ) at width d, from SOURCE (compiled once, all widths in one module)."""
    key = (SOURCE, d)
    if key not in _LOADED:
        _LOADED[key] = {
            16: (kernel(SOURCE, "flash_forward_16"), kernel(SOURCE, "flash_key_grads_16"),
                 kernel(SOURCE, "flash_query_grads_16"), kernel(SOURCE, "flash_delta_16")),
            32: (kernel(SOURCE, "flash_forward_32"), kernel(SOURCE, "flash_key_grads_32"),
                 kernel(SOURCE, "flash_query_grads_32"), kernel(SOURCE, "flash_delta_32")),
            64: (kernel(SOURCE, "flash_forward_64"), kernel(SOURCE, "flash_key_grads_64"),
                 kernel(SOURCE, "flash_query_grads_64"), kernel(SOURCE, "flash_delta_64")),
            128: (kernel(SOURCE, "flash_forward_128"), kernel(SOURCE, "flash_key_grads_128"),
                  kernel(SOURCE, "flash_query_grads_128"), kernel(SOURCE, "flash_delta_128"))}[d]
    return _LOADED[key]


def _launch(fn: Any, d: int, size: int, heads: int, args: tuple) -> None:
    """One of the row kernels over `size` rows of B·H = `heads` heads, as CONFIG[d] says."""
    g, rows = CONFIG[d]
    fn(((size + rows - 1) // rows, heads), (rows * g,), args)


def _fits(*xs: Any) -> bool:
    """float32, 3-D or 4-D, rows contiguous and 16-byte aligned (the kernels read float4s)."""
    return all(type(x) is _empty and x.dtype == F32 and x.ndim in (3, 4)
               and x.strides[-1] == 4 and all(st % 16 == 0 for st in x.strides[:-1])
               and x.data.ptr % 16 == 0 for x in xs)


def _heads(x: Any) -> tuple[int, int]:
    return (x.shape[0], x.shape[1]) if len(x.shape) == 4 else (x.shape[0], 1)


def takes(q: Any, k: Any, v: Any) -> bool:
    """Whether the kernels take these shapes (the dtype and layout are _fits'): a compiled width,
    v as wide as k, the same leading dimensions, B·H within the grid."""
    d = q.shape[-1]
    return (d in WIDTHS and v.shape[-1] == d and q.shape[:-2] == k.shape[:-2]
            and int(np.prod(_heads(q))) <= MAX_HEADS)


def like_heads(x: Any, dtype: Any = F32) -> Any:
    """An output of x's shape laid out (B, T, H, D) in memory: the heads' merge is then a view."""
    if x.ndim == 3:
        return _empty(x.shape, dtype)
    b, h, t, d = x.shape
    return _empty((b, t, h, d), dtype).transpose(0, 2, 1, 3)


def float32_kernels(d: int) -> str:
    """Which float32 kernels a pass at width d takes: "flash" (attention_f32.py) where FLOAT32
    asks for them (or, "auto", they are measured faster) and they are compiled for d, else
    "rows" (this file's)."""
    widths = {"flash": attention_f32.WIDTHS, "auto": attention_f32.MEASURED}.get(FLOAT32, ())
    return "flash" if d in widths else "rows"


def float32_units(d: int, t: int) -> str:
    """The units a float32 pass at width d, query length t computes on (the bench's rows name
    them): "FFMA" (CUDA cores, exact float32 products), or "3xTF32" (attention_f32_tc.py,
    _tc_grad.py) for the passes that run on the tensor cores."""
    if float32_kernels(d) != "flash":
        return "FFMA"
    fwd, bwd = d in attention_f32_tc.TC, attention_f32_tc_grad.takes(d, t)
    return {(True, True): "3xTF32", (True, False): "3xTF32 fwd, FFMA bwd",
            (False, True): "FFMA fwd, 3xTF32 bwd"}.get((fwd, bwd), "FFMA")


def tensor_format(be: Any, d: int) -> str | None:
    """The format the tensor-core kernels (attention_mma.py) read in this backend's precision, or
    None: fp32 and tf32 runs take the float32 kernels (tf32 rounds matrix products' inputs only,
    and these kernels are the float32 reference's arithmetic)."""
    precision = getattr(be, "precision", "fp32")
    return precision if precision in attention_mma.FORMATS and d in attention_mma.WIDTHS else None


def attention_forward(be: Any, q: Any, k: Any, v: Any, op: Any) -> Any:
    """fused_forward["attention"]: O and lse in one launch (declines what the kernels do not
    take: another width, dtype or layout, a value width unlike the key width)."""
    if not takes(q, k, v) or not _fits(q, k, v):
        return None
    d, (batch, heads), t, s = q.shape[-1], _heads(q), q.shape[-2], k.shape[-2]
    out = like_heads(q)
    lse = _empty(q.shape[:-1] + (1,), F32)
    fmt = tensor_format(be, d)
    kept = None  # the tensor-core forward's 16-bit Q rows, for the backward's key kernel
    if fmt:
        kept = attention_mma.forward(q, k, v, out, lse, fmt, (batch, heads), op.factor(d), op.causal,
                                     copies=getattr(op, "copies", False))  # O's copy: a product reads it
    elif float32_kernels(d) == "flash":  # at attention_f32_tc.TC's widths on the tensor cores
        flash = attention_f32_tc.forward if d in attention_f32_tc.TC else attention_f32.forward
        flash(q, k, v, out, lse, (batch, heads), op.factor(d), op.causal)
    else:
        _launch(_kernels(d)[0], d, t, batch * heads,
                (q, k, v, out, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
                 np.int32(heads), np.int32(t), np.int32(s), np.float32(op.factor(d)),
                 np.int32(op.causal)))
    op.saved = (lse,) if kept is None else (lse, kept)
    return out


def attention_rule(be: Any, grad: Any, out: Any, q: Any, k: Any, v: Any, op: Any) -> Any:
    """fused["attention"]: dQ, dK, dV from O, lse and dO in three launches: δ, then dK and dV,
    then dQ (declines as the forward, or when the saved lse is not the kernel's)."""
    lse = op.saved[0] if op.saved else None
    if (not takes(q, k, v) or not _fits(q, k, v, out, grad) or type(lse) is not _empty
            or lse.dtype != F32 or not lse.flags.c_contiguous):
        return None
    d, (batch, heads), t, s = q.shape[-1], _heads(q), q.shape[-2], k.shape[-2]
    dq, dk, dv = like_heads(q), like_heads(k), like_heads(v)
    fmt = tensor_format(be, d)
    if not fmt and float32_kernels(d) == "flash":  # two launches: δ (and dQ's zeros), keys
        flash = (attention_f32_tc_grad.backward if attention_f32_tc_grad.takes(d, t)
                 else attention_f32.backward)  # at TCB's widths (from FROM's T) on the tensor cores
        flash(q, k, v, grad, out, lse, (dq, dk, dv), (batch, heads), op.factor(d), op.causal)
        return dq, dk, dv
    delta = _empty((batch * heads * t,), F32)
    if fmt:  # δ computed as dO is converted
        attention_mma.backward(q, k, v, grad, lse, delta, (dq, dk, dv), fmt, (batch, heads),
                               op.factor(d), op.causal, out=out, copies=getattr(op, "grad_copies", False),
                               q_rows=op.saved[1] if len(op.saved) > 1 else None)
        return dq, dk, dv
    forward, keys, queries, deltas = _kernels(d)
    deltas(((delta.size + 127) // 128,), (128,), (
        out, grad, delta, *_strides(out), *_strides(grad), np.int32(heads), np.int32(t),
        np.int32(delta.size)))
    tail = (np.int32(heads), np.int32(t), np.int32(s), np.float32(op.factor(d)), np.int32(op.causal))
    common = (q, k, v, grad, lse, delta)
    _launch(keys, d, s, batch * heads,
            (*common, dk, dv, *(n for x in (q, k, v, grad, dk, dv) for n in _strides(x)), *tail))
    _launch(queries, d, t, batch * heads,
            (*common, dq, dq, *(n for x in (q, k, v, grad, dq, dq) for n in _strides(x)), *tail))
    return dq, dk, dv

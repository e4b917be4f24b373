"""A self-attention's q, k, v as one product on the GPU (autodiff/qkv_attention.py's fused forward
and rule): the three weights joined side by side (C, 3C) each step, P = x·[Wq|Wk|Wv] + [bq|bk|bv]
(B, T, 3C) in one cuBLASLt product, q, k, v read from P through their strides by the attention's
own fused forward. The rule: attention's rule, dq|dk|dv joined into dP (B, T, 3C), then one
product for dx = dP·[Wq|Wk|Wv]ᵀ, one for dW = xᵀ·dP, one column sum for db.

Joining costs a pass over the weights (3C² numbers, small beside the (B·T, C) activations;
forward, and again in the rule) and one over dq, dk, dv, which replaces the two adds that summed
three dx and the three roundings of dq, dk, dv: the join writes dP's 16-bit copy. What the
kernels do not take declines before running (the reference runs); `QKV = False` records three
Linears and `attention`. Measured (round 9, bf16 at 8 × 512): the join beats three products for
dx reading each other's sums as C and three for dW on dq, dk, dv apart: 12.65 ms a step against 13.10.
"""

from __future__ import annotations

from typing import Any

from . import halves
from .common import F32, HEADER, _empty, cupy, kernel, launch
from .gemm import OP_N
from .reductions import column_sums

# False: the Transformer records three Linears and `attention` on the GPU too (the path before
# this one); cupy.py reads it once per backend, as linear.py's switches.
QKV = True

SOURCE = HEADER + halves.HALF + r"""
// out (rows, 3·cols) = [a | b | c] row by row, 4 floats a thread (cols a multiple of 4), and its
// 16-bit copy when h is not null.
extern "C" __global__ void join_thirds(const float4* a, const float4* b, const float4* c,
                                       float4* out, unsigned short* h, long long rows,
                                       long long cols4, int fp16) {
    GRID_STRIDE(i, rows * 3 * cols4) {
        long long r = i / (3 * cols4), j = i - r * 3 * cols4;
        int part = (int)(j / cols4);
        long long col = j - part * cols4;
        const float4* src = part == 0 ? a : (part == 1 ? b : c);
        float4 x = src[r * cols4 + col];
        out[i] = x;
        put_half(h, 4 * i, x.x, fp16); put_half(h, 4 * i + 1, x.y, fp16);
        put_half(h, 4 * i + 2, x.z, fp16); put_half(h, 4 * i + 3, x.w, fp16);
    }
}
// The inverse, without copies: a, b, c (rows, cols) from x (rows, 3·cols).
extern "C" __global__ void split_thirds(const float4* x, float4* a, float4* b, float4* c,
                                        long long rows, long long cols4) {
    GRID_STRIDE(i, rows * 3 * cols4) {
        long long r = i / (3 * cols4), j = i - r * 3 * cols4;
        int part = (int)(j / cols4);
        long long col = j - part * cols4;
        float4* dst = part == 0 ? a : (part == 1 ? b : c);
        dst[r * cols4 + col] = x[i];
    }
}
"""


def _plain(*xs: Any) -> bool:
    return all(type(x) is _empty and x.dtype == F32 and x._c_contiguous and x.data.ptr % 16 == 0
               for x in xs)


def join(parts: tuple[Any, Any, Any], precision: str) -> Any:
    """[a | b | c] (rows, 3·cols) from three contiguous (rows, cols) float32 arrays (a 1-D array
    is one row), with its registered 16-bit copy in bf16/fp16."""
    a = parts[0]
    rows, cols = (1, a.shape[0]) if a.ndim == 1 else (a.size // a.shape[-1], a.shape[-1])
    out = _empty(a.shape[:-1] + (3 * cols,), F32)
    half = halves.output_copy(out, precision)
    launch(kernel(SOURCE, "join_thirds"), rows * 3 * cols // 4,
           (*parts, out, half, rows, cols // 4, halves.fp16_flag(precision)))
    return out


def split(x: Any) -> tuple[Any, Any, Any]:
    """The inverse of join for a (rows, 3·cols) array: three (rows, cols) arrays of their own."""
    rows, cols = x.shape[0], x.shape[1] // 3
    parts = tuple(_empty((rows, cols), F32) for _ in range(3))
    launch(kernel(SOURCE, "split_thirds"), x.size // 4, (x, *parts, rows, cols // 4))
    return parts


def heads_of(packed: Any, heads: int) -> list[Any]:
    """q, k, v (B, H, T, D) as views of P (B, T, 3C): no copy, the attention reads strides."""
    b, t, c3 = packed.shape
    split5 = packed.reshape(b, t, 3, heads, c3 // 3 // heads)
    return [split5[:, :, j].transpose(0, 2, 1, 3) for j in range(3)]


def _fits(be: Any, x: Any, params: tuple) -> bool:
    c = x.shape[-1] if x.ndim == 3 else 0
    return (c % 4 == 0 and c > 0 and x.shape[0] * x.shape[1] > 0 and _plain(x, *params)
            and "attention" in be.fused_forward and "attention" in be.fused)


def qkv_attention_forward(be: Any, x: Any, *rest: Any) -> Any | None:
    """fused_forward["qkv_attention"]: P = x·W + b with W = [Wq|Wk|Wv] (C, 3C) in one product
    (outᵀ (3C × rows, column-major) = Wᵀ·xᵀ, b added by its epilogue), then the attention's
    fused forward on P's views; declines where either declines."""
    *params, op = rest  # Wq, bq, Wk, bk, Wv, bv, then the operation
    if len(params) != 6 or not _fits(be, x, params):
        return None
    wq, bq, wk, bk, wv, bv = params
    b, t, c = x.shape
    w, bias = join((wq, wk, wv), be.precision), join((bq, bk, bv), "fp32")
    packed = _empty((b, t, 3 * c), F32)
    if not be._gemm._lt().gemm(be.precision, OP_N, OP_N, 3 * c, b * t, c, w, 3 * c, x, c,
                               packed, 3 * c, bias=bias, epilogue="bias"):
        return None
    out = be.fused_forward["attention"](be, *heads_of(packed, op.heads), op.attention)
    if out is None:
        return None
    op.kept = (packed,)  # q, k, v for the rule (the weights are joined again there: 3C² numbers)
    return out


def qkv_attention_rule(be: Any, grad: Any, out: Any, x: Any, *rest: Any) -> tuple | None:
    """fused["qkv_attention"]: dq, dk, dv from the attention's fused rule, joined into dP (with
    its 16-bit copy); dx = dP·Wᵀ, dW = xᵀ·dP (split into three), db = Σ dP over the rows."""
    *params, op = rest
    if len(params) != 6 or len(op.kept) != 1 or not _fits(be, x, params):
        return None
    wq, bq, wk, bk, wv, bv = params
    (packed,) = op.kept
    grads = be.fused["attention"](be, grad, out, *heads_of(packed, op.heads), op.attention)
    if grads is None:
        return None
    b, t, c = x.shape
    rows = b * t
    # (B, H, T, D) -> (B·T, C): a view where the rule laid them out (B, T, H, D), else a copy
    merged = tuple(cupy.ascontiguousarray(d.transpose(0, 2, 1, 3)).reshape(rows, c) for d in grads)
    if not _plain(*merged):
        return None
    dpacked = join(merged, be.precision)  # (B·T, 3C)
    w = join((wq, wk, wv), be.precision)  # (C, 3C), with its 16-bit copy
    gemm = be._gemm
    dx = gemm.matmul(dpacked, w.T)  # (B·T, C)
    dw = gemm.weight_gradient(x.reshape(rows, c), dpacked)  # (C, 3C)
    if dx is None or dw is None:
        return None
    db = _empty((3 * c,), F32)
    column_sums(dpacked, db, rows, 3 * c)
    dwq, dwk, dwv = split(dw)
    return dx.reshape(b, t, c), dwq, db[:c], dwk, db[c:2 * c], dwv, db[2 * c:]


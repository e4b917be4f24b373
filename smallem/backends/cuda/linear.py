"""A Linear layer on the GPU: y = x·W + b as one cuBLASLt product whose epilogue adds b, and its
rule as two products and a column sum (db), or two products, the weight gradient's epilogue
summing db on the way (BGRADA: selectable, slower on the H200). y = r + x·W + b (`linear_add`,
a Linear ending a residual half) is the same product reading r as its C.

operations.Linear is the reference (matmul then add; its rule the matmul's and the sum over the
rows); these are its fused forward and rule, the tape's contract. Every precision goes through
cuBLASLt here, fp32 too (COMPUTE_32F: no tensor cores, float32 arithmetic as cublasSgemm's).
Where cuBLASLt has no algorithm with the epilogue (asked once per shape), the forward declines
(the reference's product and add run) and the rule sums db in a launch of its own. Anything but
contiguous float32 declines: the reference runs.
"""

from __future__ import annotations

from typing import Any

from . import halves
from .common import F32, _empty
from .gemm import OP_N, OP_T, matrix_layout
from .reductions import column_sums, kept_sums

# False: nn.Linear records a matmul and an add on the GPU too (the path before the epilogues:
# product, bias add, column sum, each a launch of its own); cupy.py reads it once per backend.
EPILOGUES = True
# False: nn.Linear given a residual (the Transformer's output and contract layers) records the
# Linear and an add (a pass of its own, binary_add_half) instead of `linear_add`, whose product
# reads the residual as its C; cupy.py reads it once per backend.
RESIDUAL = True
# The precisions whose db the weight gradient's product sums (BGRADA); in the others db is a
# column sum of the float32 dy in launches of its own. None by default, measured on the H200
# (round 7, benchmarks/results/round7/bf16_epilogues.md): in fp32 and TF32 no step was faster
# with it (within 0.3 %, the MLP's 2-4 % slower); in bf16 cuBLASLt sums db in a kernel of its
# own beside the product and, for the 257-wide head, falls back to a slow product (167 µs): the
# default bf16 step 0.806 ms with it, 0.646 without.
BGRAD: tuple[str, ...] = ()


def _fits(x: Any, w: Any, b: Any) -> bool:
    return (type(x) is _empty and type(w) is _empty and type(b) is _empty
            and x.dtype == F32 and w.dtype == F32 and b.dtype == F32
            and x._c_contiguous and b._c_contiguous and x.ndim >= 2 and w.ndim == 2
            and b.ndim == 1 and x.shape[-1] == w.shape[0] and b.shape[0] == w.shape[1]
            and x.size > 0 and b.size > 0)


def linear_forward(be: Any, x: Any, w: Any, b: Any, op: Any) -> Any | None:
    """fused_forward["linear"]: x (..., K) @ W (K, N) + b over all rows as one product, b added
    by its epilogue. Column-major, as gemm.py reads row-major arrays: outᵀ (N × rows) = Wᵀ·xᵀ,
    so b holds one entry per row of outᵀ, which is what the BIAS epilogue adds."""
    layout_w = matrix_layout(w) if _fits(x, w, b) else None
    if layout_w is None:
        return None
    k, n = w.shape
    rows = x.size // k
    out = _empty(x.shape[:-1] + (n,), F32)
    if be._gemm._lt().gemm(be.precision, layout_w[0], OP_N, n, rows, k, w, layout_w[1], x, k,
                           out, n, bias=b, epilogue="bias"):
        return out
    return None  # no epilogue for this shape: the reference's product, then its add


def linear_rule(be: Any, grad: Any, out: Any, x: Any, w: Any, b: Any, op: Any) -> tuple | None:
    """fused["linear"]: dW and db (weight_grads), dx = dy·Wᵀ from one more product."""
    parts = weight_grads(be, grad, x, w, b)
    dx = None if parts is None else be._gemm.matmul(grad, w.T)
    return None if dx is None else (dx, *parts)


def weight_grads(be: Any, grad: Any, x: Any, w: Any, b: Any) -> tuple | None:
    """(dW, db) of a Linear's rule: dW from one product over all rows; db the column sums dy's
    producer kept (GELU's rule: gelu.SUMS), or summed by that product's BGRADA epilogue in the
    precisions of BGRAD (dWᵀ (N × K, column-major) = dyᵀ·x: A is dy as stored, summed over the
    product's k, the rows; none by default), or a column sum of the float32 dy."""
    if (not _fits(x, w, b) or type(grad) is not _empty or grad.dtype != F32
            or not grad._c_contiguous or grad.shape[-1] != w.shape[1]):
        return None
    gemm = be._gemm
    if halves.wanted(be.precision):  # both products read dy: its 16-bit copy made once, if need be
        halves.rounded(grad, be.precision, keep=True)
    k, n = w.shape
    rows = grad.size // n
    dw, db = _empty((k, n), F32), kept_sums(grad, n)
    if db is not None:
        dw = gemm.weight_gradient(x, grad)
    elif not (be.precision in BGRAD and gemm._lt().gemm(be.precision, OP_N, OP_T, n, k, rows, grad, n,
                                                        x, k, dw, n, bias=(db := _empty((n,), F32)),
                                                        epilogue="bgrada")):
        dw = gemm.weight_gradient(x, grad)  # no epilogue for it: the product, then the sum
        db = _empty((n,), F32)
        column_sums(grad, db, rows, n)
    return None if dw is None else (dw, db)


def _fits_residual(x: Any, w: Any, b: Any, r: Any) -> bool:
    return (_fits(x, w, b) and type(r) is _empty and r.dtype == F32 and r._c_contiguous
            and r.shape == x.shape[:-1] + (w.shape[1],))


def linear_add_forward(be: Any, x: Any, w: Any, b: Any, r: Any, op: Any) -> Any | None:
    """fused_forward["linear_add"]: r + x·W + b as one product, r read as its C (beta 1, laid out
    as the output: outᵀ column-major is r as stored) and b added by its epilogue. The residual
    stream's float32 sum needs no 16-bit copy: LayerNorm and the next add read it, no product."""
    layout_w = matrix_layout(w) if _fits_residual(x, w, b, r) else None
    if layout_w is None:
        return None
    k, n = w.shape
    rows = x.size // k
    out = _empty(r.shape, F32)
    if be._gemm._lt().gemm(be.precision, layout_w[0], OP_N, n, rows, k, w, layout_w[1], x, k,
                           out, n, bias=b, epilogue="bias", c=r):
        return out
    return None  # the reference: the product, the bias add, the residual add


def linear_add_rule(be: Any, grad: Any, out: Any, x: Any, w: Any, b: Any, r: Any,
                    op: Any) -> tuple | None:
    """fused["linear_add"]: the Linear's rule (dx, dW, db), and dr = dy as it is."""
    grads = linear_rule(be, grad, out, x, w, b, op) if _fits_residual(x, w, b, r) else None
    return None if grads is None else (*grads, grad)

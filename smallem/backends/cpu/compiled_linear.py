"""A Linear's pieces without the GIL (issue 38): numba loops that call NumPy's own OpenBLAS
(cblas_sgemm, found in the loaded library) for each piece's product and add its bias and
residual in the same call, each team thread taking pieces from one atomic counter until none is
left, so a thread takes the GIL once a run, not twice a piece. linear.py uses these where
compiled.py finds them; anything else (another BLAS, no numba) runs linear.py's NumPy calls.

Same library, same sgemm arguments as NumPy's matmul (row-major, the transposes its strides
ask for), the same float32 adds in the same order, no fastmath: NumPy's bits, tested in
tests/test_cpu_linear.py. BLAS stays one thread per call: threads.py's threadpoolctl limit is
set on this very library.
"""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from . import compiled_cache  # noqa: F401  (numba's cache keyed on every compiled*.py: first)

EXACT = {"nogil": True, "cache": True, "error_model": "numpy", "boundscheck": False}
# NumPy's OpenBLAS with 64-bit integers: numpy ≥ 2's wheels (scipy_openblas64), 1.2x's (openblas64_)
SYMBOLS = ("scipy_cblas_sgemm64_", "cblas_sgemm64_")
ALIAS = "smallem_cblas_sgemm_ilp64"  # one name in numba's cached code, whichever was found
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
ONE, ZERO = np.float32(1.0), np.float32(0.0)


def _find_sgemm() -> int | None:
    """The address of cblas_sgemm (64-bit integers) in the OpenBLAS NumPy loaded, or None."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    for info in threadpool_info():
        if info.get("internal_api") != "openblas":
            continue
        try:
            lib = ctypes.CDLL(info["filepath"])
        except OSError:
            continue
        for name in SYMBOLS:
            if hasattr(lib, name):
                return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    return None


ADDRESS = _find_sgemm()
if ADDRESS is None:
    raise ImportError("NumPy's BLAS is not an OpenBLAS with cblas_sgemm64_")
llvm.add_symbol(ALIAS, ADDRESS)
_P, _I, _E = types.CPointer(types.float32), types.int64, types.int32
_sgemm = types.ExternalFunction(ALIAS, types.void(_E, _E, _E, _I, _I, _I, types.float32, _P, _I,
                                                  _P, _I, types.float32, _P, _I))


@intrinsic
def _ptr(typingctx, arr):
    """The address of an array's (or view's) first float32."""
    def codegen(context, builder, signature, args):
        return context.make_array(signature.args[0])(context, builder, args[0]).data
    return _P(arr), codegen


@intrinsic
def _take(typingctx, counter):
    """counter[0] += 1, atomically; the value before: the next piece's number."""
    def codegen(context, builder, signature, args):
        first = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.atomic_rmw("add", first, context.get_constant(types.int64, 1), "seq_cst")
    return types.int64(counter), codegen


@numba.njit(**EXACT)
def _forward_piece(x, w, b, r, residual, out, a, z):
    """Rows a:z of y = x·W + b (then + r where `residual`): x (rows, K), W (K, N), out (rows, N),
    all C-contiguous."""
    k, n = w.shape
    y = out[a:z]
    for row in range(z - a):  # y = b, then y = x·W + 1·y: the sum's one rounding, as x·W then + b
        for j in range(n):
            y[row, j] = b[j]
    _sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, z - a, n, k, ONE, _ptr(x[a:z]), k, _ptr(w), n,
           ONE, _ptr(y), n)
    if residual:  # (y + b) + r: compiled_passes.add_bias(_residual)'s order
        for row in range(z - a):
            for j in range(n):
                y[row, j] += r[a + row, j]


@numba.njit(**EXACT)
def linear_forward(x, w, b, r, residual, out, cuts, counter):
    """Pieces of y = x·W + b (then + r where `residual`): rows cuts[i]:cuts[i + 1], taken from
    `counter` until none is left. Returns how many pieces this thread did."""
    did = 0
    while True:
        i = _take(counter)
        if i >= cuts.size - 1:
            return did
        _forward_piece(x, w, b, r, residual, out, cuts[i], cuts[i + 1])
        did += 1


DX, DW_ROWS, DW_SUM, DB = 0, 1, 2, 3  # linear.py's jobs: (kind, start, stop, slot)


@numba.njit(**EXACT)
def _rule_piece(g, x, w, dx, dw, dw_parts, grads, db_parts, kind, a, z, slot):
    """One piece of a Linear's rule: dx[a:z] = g[a:z]·Wᵀ; dW[a:z] = x[:, a:z]ᵀ·g (rows of xᵀ);
    dw_parts[slot] = x[a:z]ᵀ·g[a:z] (slices of the rows, summed after in order); db_parts[slot]
    = Σ grads[a:z] by rows in order (grads: dy as (B, rest)). g (rows, N), x (rows, K), W (K, N)."""
    k, n = w.shape
    rows = x.shape[0]
    if kind == DX:
        _sgemm(ROW_MAJOR, NO_TRANS, TRANS, z - a, k, n, ONE, _ptr(g[a:z]), n, _ptr(w), n,
               ZERO, _ptr(dx[a:z]), k)
    elif kind == DW_ROWS:
        _sgemm(ROW_MAJOR, TRANS, NO_TRANS, z - a, n, rows, ONE, _ptr(x[:, a:z]), k, _ptr(g), n,
               ZERO, _ptr(dw[a:z]), n)
    elif kind == DW_SUM:
        _sgemm(ROW_MAJOR, TRANS, NO_TRANS, k, n, z - a, ONE, _ptr(x[a:z]), k, _ptr(g[a:z]), n,
               ZERO, _ptr(dw_parts[slot]), n)
    else:  # NumPy's sum over the first axis: the first row, then each next one added
        acc = db_parts[slot]
        acc[:] = grads[a]
        for row in range(a + 1, z):
            for j in range(acc.size):
                acc[j] += grads[row, j]


@numba.njit(**EXACT)
def linear_rule(g, x, w, dx, dw, dw_parts, grads, db_parts, jobs, counter, fold):
    """Pieces of a Linear's rule (_rule_piece's), jobs[i] = (kind, a, z, slot) taken from
    `counter`. Returns how many pieces this thread did. `fold` (one thread takes every piece, in
    the jobs' order): a partial sum's piece past the first goes to place 1 and is added to place
    0 at once, while in cache: sum_parts' adds in its order (the same bits), without writing
    every part to memory and reading it back (round 15)."""
    did = 0
    while True:
        i = _take(counter)
        if i >= jobs.shape[0]:
            return did
        kind, slot = jobs[i, 0], jobs[i, 3]
        folded = fold and slot > 0 and (kind == DW_SUM or kind == DB)
        _rule_piece(g, x, w, dx, dw, dw_parts, grads, db_parts, kind, jobs[i, 1], jobs[i, 2],
                    1 if folded else slot)
        if folded:
            parts = dw_parts.reshape(dw_parts.shape[0], -1) if kind == DW_SUM else db_parts
            first, this = parts[0], parts[1]
            for j in range(first.size):
                first[j] += this[j]
        did += 1


ALL = {"linear_forward": linear_forward, "linear_rule": linear_rule}

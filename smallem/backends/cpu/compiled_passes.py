"""numba's exact elementwise passes for the float32 CPU engine (compiled.py loads them with
compiled_kernels.py): AdamW over a flat piece of the parameters, a Linear's bias (and
residual) added to its product's rows, and the embedding's gradient (a scatter-add of rows),
each one loop that releases the GIL, where NumPy makes two to ten passes (the scatter-add: a
sort, a gather of every row and a reduceat, 0.95 ms a step on one host core in round 14). No
fastmath here: every value is the NumPy route's, bit for bit (the same float32 operations in the
same order, nothing fused into an FMA), tested in test_cpu_linear.py and test_cpu_compiled.py.
"""

from __future__ import annotations

import numba
import numpy as np

from . import compiled_cache  # noqa: F401  (numba's cache keyed on every compiled*.py: first)

EXACT = {"nogil": True, "cache": True, "error_model": "numpy", "boundscheck": False}


@numba.njit(**EXACT)
def adamw(p, g, m, v, beta1, c1, beta2, c2, bc2, eps, decay, lr_bc1):
    """products.adamw's passes in one loop over flat float32 pieces, every scalar float32 as NumPy
    makes a Python float beside a float32 array: m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
    p = p·decay − m·(lr/bc1) / (√(v/bc2) + ε)."""
    for i in range(p.size):
        gi = g[i]
        mi = m[i] * beta1 + c1 * gi
        vi = v[i] * beta2 + c2 * (gi * gi)
        m[i] = mi
        v[i] = vi
        p[i] = p[i] * decay - (mi * lr_bc1) / (np.sqrt(vi / bc2) + eps)


@numba.njit(**EXACT)
def add_bias(out, b):
    """out (rows, N) += b (N): a Linear's bias on its product's rows, in place."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] += b[j]


@numba.njit(**EXACT)
def add_bias_residual(out, b, r):
    """out (rows, N) = (out + b) + r: a Linear's bias, then the residual stream (linear_add)."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = (out[i, j] + b[j]) + r[i, j]


@numba.njit(**EXACT)
def sum_parts(parts):
    """parts[0] += parts[1], then += parts[2], ... (parts (P, M)), in place; returns parts[0]:
    products._sum_in_order's float32 adds in its order, one loop where it makes P − 1 NumPy
    calls (a Linear rule's 16 partial bias gradients: ~60 µs of calls, round 14)."""
    out = parts[0]
    for p in range(1, parts.shape[0]):
        for j in range(out.size):
            out[j] += parts[p, j]
    return out


@numba.njit(**EXACT)
def _leaf(b, lo, n, out, r):
    """out (width,) = Σ b[lo:lo + n] by columns, n ≤ 128, in NumPy's pairwise order for float32
    (its reduce loop: under 8 terms one by one from −0.0; else eight running sums, then
    ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)) and the rest one by one); r: 8 rows of
    scratch. Rows copied element by element: numba's slice copies cost ~70 ns a row more."""
    width = b.shape[1]
    if n < 8:
        for j in range(width):
            out[j] = -0.0
        for i in range(lo, lo + n):
            for j in range(width):
                out[j] += b[i, j]
        return
    for k in range(8):
        for j in range(width):
            r[k, j] = b[lo + k, j]
    i = 8
    while i < n - n % 8:
        for k in range(8):
            for j in range(width):
                r[k, j] += b[lo + i + k, j]
        i += 8
    for j in range(width):
        out[j] = ((r[0, j] + r[1, j]) + (r[2, j] + r[3, j])) + ((r[4, j] + r[5, j]) + (r[6, j] + r[7, j]))
    for p in range(lo + i, lo + n):
        for j in range(width):
            out[j] += b[p, j]


@numba.njit(**EXACT)
def _pairwise(b, lo, n, out, scratch, frames):
    """_leaf's sum for any n: past 128 terms NumPy sums the two halves (cut on a multiple of 8)
    and adds them; here that recursion walked with a stack of frames (lo, n, halves done?) and
    one of sums in scratch[8:], since numba's cache loads a recursive function broken (a crash)."""
    width = b.shape[1]
    frames[0, 0], frames[0, 1], frames[0, 2] = lo, n, 0
    top, sums = 1, 0
    while top:
        top -= 1
        a, m, done = frames[top, 0], frames[top, 1], frames[top, 2]
        if m <= 128:
            _leaf(b, a, m, scratch[8 + sums], scratch[:8])
            sums += 1
        elif done:  # both halves summed: the left one plus the right one
            sums -= 1
            for j in range(width):
                scratch[7 + sums, j] = scratch[7 + sums, j] + scratch[8 + sums, j]
        else:
            half = m // 2
            half -= half % 8
            frames[top, 2] = 1
            frames[top + 1, 0], frames[top + 1, 1], frames[top + 1, 2] = a + half, m - half, 0
            frames[top + 2, 0], frames[top + 2, 1], frames[top + 2, 2] = a, half, 0
            top += 3
    for j in range(width):
        out[j] = scratch[8, j]


@numba.njit(**EXACT)
def scatter_add_rows(values, rows, out):
    """out[rows[i]] += values[i] (values (n, width), out (table rows, width) of zeros) with
    numpy.py's bits: its stable sort then reduceat gives each table row its first term plus
    the pairwise sum of the others, in the order they come; here a counting sort (one pass)
    and the same sums."""
    width = values.shape[1]
    starts = np.zeros(out.shape[0] + 1, np.int64)
    for i in range(rows.size):
        starts[rows[i] + 1] += 1
    for r in range(out.shape[0]):
        starts[r + 1] += starts[r]
    fill, b = starts.copy(), np.empty_like(values)  # b: the values sorted by row, stably
    for i in range(rows.size):
        p = fill[rows[i]]
        for j in range(width):
            b[p, j] = values[i, j]
        fill[rows[i]] += 1
    scratch, rest = np.empty((8 + 64, width), np.float32), np.empty(width, np.float32)
    frames = np.empty((128, 3), np.int64)
    for r in range(out.shape[0]):
        a, z = starts[r], starts[r + 1]
        if z == a:
            continue
        for j in range(width):
            out[r, j] = b[a, j]
        if z - a > 1:
            _pairwise(b, a + 1, z - a - 1, rest, scratch, frames)
            for j in range(width):
                out[r, j] += rest[j]


ALL = {"adamw": adamw, "add_bias": add_bias, "add_bias_residual": add_bias_residual,
       "scatter_add_rows": scatter_add_rows, "sum_parts": sum_parts}

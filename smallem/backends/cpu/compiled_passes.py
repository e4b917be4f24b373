"""numba's exact elementwise passes for the float32 CPU engine (compiled.py loads them with
compiled_kernels.py): AdamW over a flat piece of the parameters, and a Linear's bias (and
residual) added to its product's rows, each one loop that releases the GIL, where NumPy makes
two to ten passes. No fastmath here: every value is the NumPy route's, bit for bit (the same
float32 operations in the same order, nothing fused into an FMA), tested in test_cpu_linear.py.
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


ALL = {"adamw": adamw, "add_bias": add_bias, "add_bias_residual": add_bias_residual}

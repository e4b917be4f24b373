"""The CPU backend: NumPy in float64 ("cpu64", for finite differences) or float32 ("cpu").

Everything is inherited from ArrayBackend; what is specialised here is for speed: the embedding
gradient (numpy.add.at is slow on the rows of a large batch) and, in float32 only, the fused
table of numpy_fused.py (softmax, LayerNorm, GELU, cross-entropy by blocks of rows in cache).
cpu64 runs every reference rule, because that is what finite differences check.
"""

from __future__ import annotations

import numpy as np

from . import numpy_fused
from .array import ArrayBackend


class NumpyBackend(ArrayBackend):
    def __init__(self, dtype: str = "float32", precision: str = "fp32") -> None:
        super().__init__(np, dtype, "cpu64" if dtype == "float64" else "cpu", precision)
        if dtype == "float32":
            self.fused = dict(numpy_fused.FUSED)
            self.fused_forward = dict(numpy_fused.FUSED_FORWARD)

    def gelu(self, a):
        if self.name == "cpu":  # float32: block by block, in cache
            out = numpy_fused.gelu(a)
            if out is not None:
                return out
        return super().gelu(a)

    def scatter_add_rows(self, values, rows, num_rows):
        # Sort the rows once, then sum each run of equal indices with reduceat: every
        # repeated index contributes, in one vectorised pass.
        tail = values.shape[rows.ndim:]
        flat = values.reshape((-1,) + tuple(tail))
        idx = rows.reshape(-1)
        out = np.zeros((num_rows,) + tuple(tail), dtype=values.dtype)
        if idx.size == 0:
            return out
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        starts = np.flatnonzero(np.r_[True, sorted_idx[1:] != sorted_idx[:-1]])
        out[sorted_idx[starts]] = np.add.reduceat(flat[order], starts, axis=0)
        return out

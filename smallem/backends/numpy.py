"""The CPU backend: NumPy in float64 ("cpu64", for finite differences) or float32 ("cpu").

Everything is inherited from ArrayBackend; what is specialised here is for speed: the embedding
gradient (numpy.add.at is slow on the rows of a large batch) and, in float32 only, the fused
table of numpy_fused.py (softmax, LayerNorm, GELU, cross-entropy by blocks of rows, on threads).
cpu64 runs every reference rule, because that is what finite differences check.
"""

from __future__ import annotations

import numpy as np

from . import numpy_fused
from .array import ArrayBackend


class NumpyBackend(ArrayBackend):
    def __init__(self, dtype: str = "float32") -> None:
        super().__init__(np, dtype, "cpu64" if dtype == "float64" else "cpu")
        if dtype == "float32":
            self.fused = dict(numpy_fused.FUSED)
            self.fused_forward = dict(numpy_fused.FUSED_FORWARD)

    # float32: large elementwise products and sums split over the threads (numpy_fused.py)
    def add(self, a, b):
        out = numpy_fused.elementwise(np.add, a, b) if self.name == "cpu" else None
        return super().add(a, b) if out is None else out

    def sub(self, a, b):
        out = numpy_fused.elementwise(np.subtract, a, b) if self.name == "cpu" else None
        return super().sub(a, b) if out is None else out

    def mul(self, a, b):
        out = numpy_fused.elementwise(np.multiply, a, b) if self.name == "cpu" else None
        return super().mul(a, b) if out is None else out

    def matmul(self, a, b):
        if self.name == "cpu" and getattr(b, "ndim", 0) > 2:  # float32 stacks: on threads
            out = numpy_fused.batched_matmul(a, b)
            if out is not None:
                return out
        return super().matmul(a, b)

    def gelu(self, a):
        if self.name == "cpu":  # float32: block by block, on threads
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

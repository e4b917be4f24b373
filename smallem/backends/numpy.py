"""The CPU backend: NumPy in float64 ("cpu64", for finite differences) or float32 ("cpu").

Everything is inherited from ArrayBackend; what is specialised here is for speed: the embedding
gradient (numpy.add.at is slow on the rows of a large batch) and, in float32 only, the fused
table of numpy_fused.py (softmax, LayerNorm, GELU, cross-entropy by blocks of rows in cache)
and the engine of cpu/ (its products, large passes, fused attention and AdamW shared over a thread
team, malloc told to keep its pages). cpu64 runs every reference rule in plain NumPy, because that is what
finite differences check; both hold BLAS to one thread (cpu/threads.py: one_blas_thread).
"""

from __future__ import annotations

import numpy as np

from . import numpy_fused
from .array import ArrayBackend
from .cpu import attention, compiled, linear, memory, products, threads


class NumpyBackend(ArrayBackend):
    def __init__(self, dtype: str = "float32", precision: str = "fp32") -> None:
        super().__init__(np, dtype, "cpu64" if dtype == "float64" else "cpu", precision)
        threads.one_blas_thread()  # both routes, cpu64 too: threads.py says why
        self.engine = dtype == "float32"  # cpu/'s team, products and updates (cpu64: none)
        if self.engine:
            self.fused = {**numpy_fused.FUSED, **attention.FUSED, **linear.FUSED}
            self.fused_forward = {**numpy_fused.FUSED_FORWARD, **attention.FUSED_FORWARD,
                                  **linear.FUSED_FORWARD}
            # nn.Linear records these only when asked (`fast`: bench's CPU rows); a lesson's
            # float32 tape keeps its matmul and add nodes, whose memory lesson 15 counts
            self.on_request = frozenset(linear.FUSED_FORWARD)
            memory.keep_pages()
            threads.settle()  # decided again at the start of every run (train(), bench)

    # the engine's shared work (cpu/products.py); None from it means plain NumPy, as cpu64 runs
    def _matmul(self, a, b):
        out = products.matmul(a, b) if self.engine else None
        return super()._matmul(a, b) if out is None else out

    def add(self, a, b):
        out = products.elementwise(np.add, a, b) if self.engine else None
        return a + b if out is None else out

    def sub(self, a, b):
        out = products.elementwise(np.subtract, a, b) if self.engine else None
        return a - b if out is None else out

    def mul(self, a, b):
        out = products.elementwise(np.multiply, a, b) if self.engine else None
        return a * b if out is None else out

    def sum(self, a, dim=None, keepdim=False):
        out = products.sum_first(a) if self.engine and dim == 0 and not keepdim else None
        return super().sum(a, dim, keepdim) if out is None else out

    def adamw_update(self, params, grads, ms, vs, *, steps, lr, beta1, beta2, eps, weight_decays):
        if not (self.engine and products.adamw(params, grads, ms, vs, steps, lr, beta1, beta2,
                                               eps, weight_decays, linear.jobs_pool())):
            super().adamw_update(params, grads, ms, vs, steps=steps, lr=lr, beta1=beta1,
                                 beta2=beta2, eps=eps, weight_decays=weight_decays)

    def gelu(self, a):
        if self.engine:  # float32: block by block, in cache
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
        kernels = compiled.kernels() if self.engine else None
        if (kernels and flat.dtype == np.float32 and flat.flags.c_contiguous and idx.dtype.kind == "i"
                and 0 <= idx.min() and idx.max() < num_rows):  # no bounds checked in there
            # one compiled pass in the rows' order: the sort's bits (compiled_passes.py)
            kernels.scatter_add_rows(flat.reshape(idx.size, -1), idx, out.reshape(num_rows, -1))
            return out
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        starts = np.flatnonzero(np.r_[True, sorted_idx[1:] != sorted_idx[:-1]])
        out[sorted_idx[starts]] = np.add.reduceat(flat[order], starts, axis=0)
        return out

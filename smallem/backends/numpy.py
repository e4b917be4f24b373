"""The CPU backend: NumPy in float64 ("cpu64", for finite differences) or float32 ("cpu").

Everything is inherited from ArrayBackend; what is specialised here is for speed: the embedding
gradient (numpy.add.at is slow on the rows of a large batch) and, in float32 only, a fused
cross-entropy. cpu64 runs every reference rule, because that is what finite differences check.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .array import ArrayBackend


class NumpyCrossEntropy:
    """kernels["cross_entropy"] on the float32 CPU: the numbers of operations.CrossEntropy's
    rule with fewer passes over the logits (the rule recomputes the log-softmax in backward and
    builds a one-hot, about twice the time). The rule stays the truth; tests compare the two."""

    @staticmethod
    def _rows(logits: np.ndarray) -> np.ndarray:
        return logits.reshape(-1, logits.shape[-1])

    def forward(self, backend: Any, op: Any, inputs: Sequence[np.ndarray]) -> Any:
        x = self._rows(inputs[0])
        if x.size == 0:
            return op.forward(backend, inputs)
        z = x - x.max(axis=1, keepdims=True)
        log_sum = np.log(np.exp(z).sum(axis=1))
        picked = np.take_along_axis(z, op.target_index(backend).reshape(-1, 1), axis=1)[:, 0]
        return np.mean(log_sum - picked)  # −log softmax[target], averaged over rows

    def backward(self, backend: Any, op: Any, inputs: Sequence[np.ndarray], output: Any,
                 grad: Any) -> list[Any]:
        x = self._rows(inputs[0])
        if x.size == 0:
            return op.backward(backend, inputs, output, grad)
        p = x - x.max(axis=1, keepdims=True)
        np.exp(p, out=p)
        p /= p.sum(axis=1, keepdims=True)  # softmax, in place
        p[np.arange(len(p)), op.target_index(backend).reshape(-1)] -= 1.0
        p *= grad / len(p)
        return [p.reshape(inputs[0].shape)]


class NumpyBackend(ArrayBackend):
    def __init__(self, dtype: str = "float32") -> None:
        super().__init__(np, dtype, "cpu64" if dtype == "float64" else "cpu")
        if dtype == "float32":
            self.kernels = {"cross_entropy": NumpyCrossEntropy()}

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

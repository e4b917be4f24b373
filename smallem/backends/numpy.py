"""The CPU backend: NumPy in float64 ("cpu64", for finite differences) or float32 ("cpu").

Everything is inherited from ArrayBackend; what is specialised here is for speed: the embedding
gradient (numpy.add.at is slow on the rows of a large batch) and, in float32 only, a fused
cross-entropy. cpu64 runs every reference rule, because that is what finite differences check.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .array import ArrayBackend


def _rows(logits: np.ndarray) -> np.ndarray:
    return logits.reshape(-1, logits.shape[-1])


def cross_entropy_forward(be: Any, logits: np.ndarray, op: Any) -> Any:
    """fused_forward["cross_entropy"] on the float32 CPU: operations.CrossEntropy's numbers in
    fewer passes over the logits. Declines (None) on an empty batch."""
    x = _rows(logits)
    if x.size == 0:
        return None
    z = x - x.max(axis=1, keepdims=True)
    log_sum = np.log(np.exp(z).sum(axis=1))
    picked = np.take_along_axis(z, op.target_index(be).reshape(-1, 1), axis=1)[:, 0]
    return np.mean(log_sum - picked)  # −log softmax[target], averaged over rows


def cross_entropy_rule(be: Any, grad: Any, out: Any, logits: np.ndarray, op: Any) -> Any:
    """fused["cross_entropy"]: the reference rule recomputes the log-softmax and builds a
    one-hot, about twice the time; this is softmax in place, minus one at the targets."""
    x = _rows(logits)
    if x.size == 0:
        return None
    p = x - x.max(axis=1, keepdims=True)
    np.exp(p, out=p)
    p /= p.sum(axis=1, keepdims=True)  # softmax, in place
    p[np.arange(len(p)), op.target_index(be).reshape(-1)] -= 1.0
    p *= grad / len(p)
    return (p.reshape(logits.shape),)


class NumpyBackend(ArrayBackend):
    def __init__(self, dtype: str = "float32", precision: str = "fp32") -> None:
        super().__init__(np, dtype, "cpu64" if dtype == "float64" else "cpu", precision)
        if dtype == "float32":
            self.fused = {"cross_entropy": cross_entropy_rule}
            self.fused_forward = {"cross_entropy": cross_entropy_forward}

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

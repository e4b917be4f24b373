"""NumPy references and hand-ons that more than one lesson grades with: softmax over rows and
one causal head (lesson 11 grades attention against them, lesson 16 its cached head), and the
learner's causal mask handed on as booleans (lesson 11's exercise, the capstone's Transformer)."""

from __future__ import annotations

import functools

import numpy as np


def softmax_rows(x: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis in NumPy; entries where `allowed` is False get exactly 0."""
    x = np.asarray(x, np.float64)
    if allowed is not None:
        x = np.where(allowed, x, -np.inf)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def head_reference(x, wq, wk, wv, *, scale: bool = True, causal: bool = True, swap: bool = False):
    """One causal head in NumPy: softmax(q kᵀ / √D) v, and the variants a mistake computes."""
    q, k, v = x @ wq, x @ wk, x @ wv
    if swap:
        q, k = k, q
    scores = q @ np.swapaxes(k, -1, -2) / (np.sqrt(q.shape[-1]) if scale else 1.0)
    t = scores.shape[-1]
    allowed = np.tril(np.ones((t, t), bool)) if causal else np.ones((t, t), bool)
    return softmax_rows(scores, allowed) @ v


def as_boolean_mask(fn):
    """The learner's mask function, handing on a boolean array (what `~` and np.where need)
    however it was written: lists of True/False, 1/0 integers. Its source stays theirs."""
    @functools.wraps(fn)  # inspect.getsource follows __wrapped__: the store keeps their cell
    def causal_mask(T):
        return np.asarray(fn(T), dtype=bool)
    return causal_mask

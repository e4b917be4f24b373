"""Fused attention: softmax(q kᵀ·s, causal) v as one Operation that keeps only O and the log-sum-exp.

The reference works in tiles of `tile` queries by `tile` keys and never holds a T × T matrix:
the forward is the online softmax (a running max, a running sum); the rule recomputes each tile's
weights from the saved log-sum-exp (FlashAttention's backward). The GPU backend's kernels match
it or decline: float32 (backends/cuda/attention.py) in fp32 and tf32 runs, the tensor cores
(attention_mma.py) in bf16 and fp16 runs. Lesson 15.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends import Backend, Tensor
from ..errors import SmallemError, require
from .operations import Operation, register

_MASKS: dict[tuple, Tensor] = {}  # (backend, dtype, rows, cols, offset) -> (rows, cols) 0 / −∞


def tile_mask(be: Backend, rows: int, cols: int, offset: int) -> Tensor:
    """Causal mask of the tile whose first query is `offset` positions after its first key:
    −∞ where key c > query r + offset. Made once per backend and shape (capture uploads none)."""
    key = (be.name, str(be.dtype), rows, cols, offset)
    if key not in _MASKS:
        r, c = np.arange(rows)[:, None], np.arange(cols)[None, :]
        _MASKS[key] = be.tensor(np.where(c > r + offset, -np.inf, 0.0))
    return _MASKS[key]


def heads_layout(be: Backend, shape: tuple[int, ...]) -> Tensor:
    """Zeros of `shape` (B, H, T, D) laid out (B, T, H, D) in memory, as the GPU kernel writes
    them: merging the heads afterwards (transpose, reshape) is then a view, not a copy."""
    if len(shape) != 4:
        return be.zeros(shape)
    b, h, t, d = shape
    return be.transpose(be.zeros((b, t, h, d)), 1, 2)


def tiles(size: int, tile: int) -> list[tuple[int, int]]:
    return [(a, min(a + tile, size)) for a in range(0, size, tile)]


def online_update(be: Backend, m: Tensor, total: Tensor, acc: Tensor, s: Tensor, v: Tensor
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """One key tile of the online softmax: m' = max(m, max s), l' = l·e^(m−m') + Σ e^(s−m'),
    acc' = acc·e^(m−m') + e^(s−m') v, l being the running sum (`total`). A fully masked row
    keeps m (its s = −∞ adds nothing)."""
    m_new = be.add(m, be.relu(be.sub(be.max(s, -1, keepdim=True), m)))  # max(m, max s), −∞-safe
    alpha = be.exp(be.sub(m, m_new))  # how much the old sums shrink under the new max
    p = be.exp(be.sub(s, m_new))
    return (m_new, be.add(be.mul(total, alpha), be.sum(p, -1, keepdim=True)),
            be.add(be.mul(acc, alpha), be.matmul(p, v)))


def tile_backward(be: Backend, q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse: Tensor,
                  delta: Tensor, scale: float, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """One (query tile, key tile): P = exp(q kᵀ·s − lse); dV = Pᵀ dO; dP = dO Vᵀ;
    dS = P ⊙ (dP − δ) with δ = rowsum(dO ⊙ O); dQ = dS K·s; dK = dSᵀ Q·s."""
    s = be.mul(be.matmul(q, be.transpose(k, -2, -1)), scale)
    if mask is not None:
        s = be.add(s, mask)
    p = be.exp(be.sub(s, lse))
    dv = be.matmul(be.transpose(p, -2, -1), do)
    dp = be.matmul(do, be.transpose(v, -2, -1))
    ds = be.mul(p, be.sub(dp, delta))
    return (be.mul(be.matmul(ds, k), scale), be.mul(be.matmul(be.transpose(ds, -2, -1), q), scale),
            dv)


@register
class Attention(Operation):
    """O = softmax(q kᵀ·scale, causal) v, q (..., T, D), k (..., S, D), v (..., S, Dv); `scale`
    defaults to 1/√D. Saved: O (its value) and lse (..., T, 1), nothing of size T × S."""

    name = "attention"

    def __init__(self, causal: bool = True, scale: float | None = None, tile: int = 64,
                 update: Callable | None = None, backward_tile: Callable | None = None,
                 copies: bool = False) -> None:
        if not isinstance(tile, (int, np.integer)) or tile < 1:
            raise SmallemError(f"attention: tile must be a whole number of at least 1, got {tile!r}")
        if scale is not None:  # a NaN scale gave NaN everywhere, silently; a string, NumPy's error
            require("attention: scale", float(scale) if isinstance(scale, (np.floating, np.integer))
                    else scale, "positive")
        self.causal, self.scale, self.tile = bool(causal), scale, int(tile)
        self.update = update or online_update  # a lesson plants the learner's here
        self.backward_tile = backward_tile or tile_backward
        # a bf16/fp16 product reads O and dQ, dK, dV (the Transformer's Linears): the GPU's
        # tensor-core kernels then write their 16-bit copies (backends/cuda/halves.py); nothing else
        # changes, and without a reader the stores are left out
        self.copies = bool(copies)
        self.grad_copies = self.copies  # dQ's, dK's, dV's alone (qkv_attention's join makes its own)
        self.saved: tuple[Tensor, ...] = ()  # (lse,), set by the forward that ran

    def check(self, *shapes: tuple[int, ...]) -> None:
        q, k, v = shapes
        if len(q) < 2 or len(k) != len(q) or len(v) != len(q) or q[:-2] != k[:-2] \
                or k[:-1] != v[:-1] or q[-1] != k[-1] or 0 in q[-2:] or 0 in k[-2:]:
            raise SmallemError(f"attention: q {list(q)}, k {list(k)}, v {list(v)} do not fit: "
                               "q (..., T, D), k (..., S, D) and v (..., S, Dv), same leading dims")
        if self.causal and q[-2] != k[-2]:
            raise SmallemError(f"attention(causal=True): queries and keys must be as many "
                               f"(T = S), got T = {q[-2]} and S = {k[-2]}")

    def factor(self, d: int) -> float:
        return float(self.scale) if self.scale is not None else 1.0 / float(np.sqrt(d))

    def key_tiles(self, i0: int, i1: int, size: int) -> list[tuple[int, int]]:
        """The key tiles query rows i0..i1 see: all, or (causal) those starting at ≤ i1 − 1."""
        return [(a, b) for a, b in tiles(size, self.tile) if not self.causal or a < i1]

    def mask(self, be: Backend, i0: int, i1: int, j0: int, j1: int) -> Tensor | None:
        return tile_mask(be, i1 - i0, j1 - j0, i0 - j0) if self.causal and j1 - 1 > i0 else None

    def forward(self, be: Backend, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        *lead, t, d = be.shape(q)
        size, scale = be.shape(k)[-2], self.factor(d)
        out = heads_layout(be, (*lead, t, be.shape(v)[-1]))
        lse = be.zeros((*lead, t, 1))
        for i0, i1 in tiles(t, self.tile):
            qi = q[..., i0:i1, :]
            m, total = None, be.zeros((*lead, i1 - i0, 1))
            acc = be.zeros((*lead, i1 - i0, be.shape(v)[-1]))
            for j0, j1 in self.key_tiles(i0, i1, size):
                s = be.mul(be.matmul(qi, be.transpose(k[..., j0:j1, :], -2, -1)), scale)
                mask = self.mask(be, i0, i1, j0, j1)
                s = s if mask is None else be.add(s, mask)
                # the first key tile holds key 0, which every query sees: its max is finite
                m = be.max(s, -1, keepdim=True) if m is None else m
                m, total, acc = self.update(be, m, total, acc, s, v[..., j0:j1, :])
            out[..., i0:i1, :] = be.div(acc, total)
            lse[..., i0:i1, :] = be.add(m, be.log(total))
        self.saved = (lse,)
        return out

    def backward(self, be: Backend, grad: Tensor, out: Tensor, q: Tensor, k: Tensor,
                 v: Tensor) -> tuple:
        """dQ, dK, dV tile by tile from P = exp(q kᵀ·s − lse): dV = Pᵀ dO; dS = P ⊙ (dO Vᵀ − δ)"""
        (lse,) = self.saved
        *lead, t, d = be.shape(q)
        size, scale = be.shape(k)[-2], self.factor(d)
        delta = be.sum(be.mul(grad, out), -1, keepdim=True)  # rowsum(dO ⊙ O): (..., T, 1)
        dq, dk, dv = (heads_layout(be, be.shape(x)) for x in (q, k, v))
        for i0, i1 in tiles(t, self.tile):
            rows = (Ellipsis, slice(i0, i1), slice(None))
            for j0, j1 in self.key_tiles(i0, i1, size):
                cols = (Ellipsis, slice(j0, j1), slice(None))
                gq, gk, gv = self.backward_tile(be, q[rows], k[cols], v[cols], grad[rows],
                                                lse[rows], delta[rows], scale,
                                                self.mask(be, i0, i1, j0, j1))
                dq[rows] = be.add(dq[rows], gq)
                dk[cols] = be.add(dk[cols], gk)
                dv[cols] = be.add(dv[cols], gv)
        return dq, dk, dv


def attention(tape: Any, q: Any, k: Any, v: Any, causal: bool = True, scale: float | None = None,
              tile: int = 64, copies: bool = False) -> Any:
    """softmax(q kᵀ·scale, causal) v as one node holding O and the log-sum-exp (lesson 15);
    `copies`: 16-bit products read O and the gradients (Attention's)."""
    return tape.apply(Attention(causal, scale, tile, copies=copies), [q, k, v])

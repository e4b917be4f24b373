"""The float32 CPU's fused attention (autodiff/attention.py's Attention: O and the log-sum-exp
kept, nothing of size T × T): the CPU's twin of backends/cuda/attention.py. The heads of a few
sequences at a time, scores, softmax and products in cache, those blocks shared over the thread
team; the rule recomputes each block's weights from the saved lse (FlashAttention's backward).
Blocks depend on the shape alone: the same bits on one thread or many."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..numpy_fused import SPREAD
from . import compiled, linear, team

F32 = np.dtype(np.float32)
BLOCK = 1 << 16  # score entries per block (256 KB): a block's few (b, H, T, T) arrays stay in L2
PASSES = 16  # a block's work in the team's units (team.worth): ~3 products of D = 16, ~6 passes
COMPILED_PASSES = 8  # the compiled block's (forward; its rule twice): the products, one pass
_MASKS: dict[int, np.ndarray] = {}  # T -> (T, T) float32: 0, or −∞ above the diagonal


def _mask(t: int) -> np.ndarray:
    if t not in _MASKS:
        _MASKS[t] = np.triu(np.full((t, t), -np.inf, F32), k=1)
    return _MASKS[t]


def _takes(*xs: Any) -> bool:
    """float32 NumPy (B, H, T, D) arrays of one shape, each D contiguous (the heads' split views
    are): what the blocks read. Anything else declines to the reference."""
    return (all(type(x) is np.ndarray and x.dtype == F32 and x.ndim == 4 and x.strides[-1] == 4
                for x in xs) and len({x.shape for x in xs}) == 1)


def like_heads(x: np.ndarray) -> np.ndarray:
    """An empty array of x's (B, H, T, D) shape laid out (B, T, H, D): the heads' merge is a view."""
    b, h, t, d = x.shape
    return np.empty((b, t, h, d), F32).transpose(0, 2, 1, 3)


def _cut(q: np.ndarray) -> tuple[list[slice], float]:
    """Consecutive blocks of the batch, each ~BLOCK score entries (NumPy's stacked products may
    give other bits for another cut), and their work in BLOCKs."""
    b, h, t, _ = q.shape
    per = h * t * t
    step = max(1, BLOCK // per)
    return [slice(i, min(i + step, b)) for i in range(0, b, step)], b * per / BLOCK


def _each(fn: Any, q: np.ndarray, passes: int = PASSES) -> list[Any]:
    """fn(s) for the blocks s of _cut over the team (`passes`: a block's work in the team's
    units, per BLOCK entries)."""
    cut, blocks = _cut(q)
    return team.run_pieces(fn, cut, team.worth(passes * blocks))


def _pooled(rule: bool, arrays: dict[int, np.ndarray], scale: Any, causal: bool, leads: np.ndarray,
            rows: int) -> bool:
    """The compiled blocks of _cut as one job of the pool (compiled_jobs.py), where
    SMALLEM_POOL_JOBS asks and the pool runs: the same calls on the same blocks. True if it ran."""
    pool = linear.jobs_pool()
    cut, blocks = _cut(arrays[0])
    if pool is None or len(cut) > pool.MAX_PIECES:
        return False
    from . import compiled_jobs, compiled_team

    factor = np.array([scale], F32)
    values = compiled_jobs.attention_values(arrays, factor, causal, rows, leads)
    kind = compiled_team.ATTENTION_RULE if rule else compiled_team.ATTENTION_FORWARD
    cuts = compiled_jobs.cuts_of(cut)
    passes = COMPILED_PASSES * (2 if rule else 1)

    def publish(helpers: int, keep: Any = (arrays, factor)) -> int:  # keep: alive until the next job
        return pool.publish_job(helpers, values, kind, cuts)
    team.pooled(publish, pool.finish, len(cut), team.worth(passes * blocks, linear.pool_grain()))
    return True


def _weights(q: np.ndarray, k: np.ndarray, scale: float, causal: bool) -> np.ndarray:
    """q kᵀ·scale (+ the causal mask) of one block: (b, H, T, T), a new array."""
    s = np.matmul(q, k.swapaxes(-1, -2))
    s *= np.float32(scale)
    if causal:
        s += _mask(s.shape[-1])
    return s


def attention_forward(be: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray, op: Any
                      ) -> np.ndarray | None:
    """fused_forward["attention"]: O = softmax(q kᵀ·s, causal) v and lse = m + log Σ e^(s−m),
    block by block (declines anything but float32 (B, H, T, D) of one shape)."""
    if not _takes(q, k, v):
        return None
    scale, out = op.factor(q.shape[-1]), like_heads(q)
    lse = np.empty(q.shape[:-1] + (1,), F32)
    if kernels := compiled.attention():  # each block one compiled call (cpu/compiled.py)
        factor = np.float32(scale)
        if (blas := compiled.attention_blas()) and blas.ready(q, k, v, out):  # products in BLAS
            leads = np.array([blas.lead(x) for x in (q, k, v, out)], np.int64)
            arrays = {0: q, 1: k, 2: v, 4: out, 5: lse}  # compiled_jobs' Q, K, V, OUT, LSE
            if not _pooled(False, arrays, factor, op.causal, leads, blas.ROWS):
                _each(lambda s: blas.attention_forward(q[s], k[s], v[s], factor, op.causal, out[s],
                                                       lse[s], leads, blas.ROWS), q, COMPILED_PASSES)
        else:
            forward = kernels.attention_kernels(*q.shape[2:])[0]
            _each(lambda s: forward(q[s], k[s], v[s], factor, op.causal, out[s], lse[s]), q,
                  COMPILED_PASSES)
        op.saved = (lse,)
        return out

    def block(s: slice) -> None:
        w = np.matmul(q[s], k[s].swapaxes(-1, -2))
        w *= np.float32(scale)
        top, low = w.max(), w.min()  # whole-block reductions: fast, unlike per-row ones
        if op.causal:
            w += _mask(w.shape[-1])
        # one shift for the block when its scores lie within SPREAD (each row's own max is then
        # ≥ top − SPREAD: its sum cannot underflow), else each row's own max (key 0 is seen by
        # every query: finite)
        m = np.float32(top) if top - low <= SPREAD else w.max(axis=-1, keepdims=True)
        w -= m
        np.exp(w, out=w)
        total = np.einsum("...j->...", w)[..., None]
        np.divide(np.matmul(w, v[s]), total, out=out[s])
        np.log(total, out=total)
        np.add(total, m, out=lse[s])

    _each(block, q)
    op.saved = (lse,)
    return out


def attention_rule(be: Any, grad: np.ndarray, out: np.ndarray, q: np.ndarray, k: np.ndarray,
                   v: np.ndarray, op: Any) -> tuple | None:
    """fused["attention"]: P = exp(q kᵀ·s − lse) recomputed; dV = Pᵀ dO; dS = P ⊙ (dO Vᵀ − δ),
    δ = rowsum(dO ⊙ O); dQ = dS K·s; dK = dSᵀ Q·s (declines as the forward, or without a
    float32 lse of the right shape)."""
    lse = op.saved[0] if op.saved else None
    if not (_takes(q, k, v, grad, out) and type(lse) is np.ndarray and lse.dtype == F32
            and lse.shape == q.shape[:-1] + (1,)):
        return None
    scale = np.float32(op.factor(q.shape[-1]))
    dq, dk, dv = like_heads(q), like_heads(k), like_heads(v)
    if kernels := compiled.attention():
        arrays = (q, k, v, grad, out, dq, dk, dv)
        if (blas := compiled.attention_blas()) and blas.ready(*arrays):
            leads = np.array([blas.lead(x) for x in arrays], np.int64)
            views = dict(zip((0, 1, 2, 3, 4, 6, 7, 8), arrays)) | {5: lse}  # compiled_jobs' order
            if not _pooled(True, views, scale, op.causal, leads, blas.ROWS):
                _each(lambda s: blas.attention_rule(q[s], k[s], v[s], grad[s], out[s], lse[s], scale,
                                                    op.causal, dq[s], dk[s], dv[s], leads, blas.ROWS),
                      q, 2 * COMPILED_PASSES)
        else:
            rule = kernels.attention_kernels(*q.shape[2:])[1]
            _each(lambda s: rule(q[s], k[s], v[s], grad[s], out[s], lse[s], scale, op.causal,
                                 dq[s], dk[s], dv[s]), q, 2 * COMPILED_PASSES)
        return dq, dk, dv

    def block(s: slice) -> None:
        p = _weights(q[s], k[s], scale, op.causal)
        p -= lse[s]
        np.exp(p, out=p)
        do = grad[s]
        np.matmul(p.swapaxes(-1, -2), do, out=dv[s])
        delta = np.einsum("...j,...j->...", do, out[s])[..., None]
        ds = np.matmul(do, v[s].swapaxes(-1, -2))
        ds -= delta
        ds *= p
        ds *= scale
        np.matmul(ds, k[s], out=dq[s])
        np.matmul(ds.swapaxes(-1, -2), q[s], out=dk[s])

    _each(block, q)
    return dq, dk, dv


FUSED = {"attention": attention_rule}
FUSED_FORWARD = {"attention": attention_forward}

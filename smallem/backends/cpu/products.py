"""The float32 CPU's products, large elementwise passes, row sums and AdamW, shared over the
thread team (team.py) in pieces cut by shape alone: the same bits on one thread or many. Each
returns None when the work is too small to cut, and the caller runs plain NumPy: the same
numbers up to float32 rounding (a product's rows, or a sum's terms, in other groupings), tested
against it in tests/test_cpu_engine.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import compiled, team

F32 = np.dtype(np.float32)
F = np.float32
MIN_MACS = 1 << 20  # multiply-adds per piece of a product: ~20-50 µs of one core, the team's cost
MIN_ITEMS = 1 << 16  # floats per piece of an elementwise pass or a sum (256 KB)


def _sum_in_order(parts: list[np.ndarray]) -> np.ndarray:
    out = parts[0]
    for p in parts[1:]:
        out += p
    return out


def long_sum(m: int, k: int) -> bool:
    """Whether an (m, k) @ (k, n) product is cut into slices of k, summed in order (a weight's
    gradient xᵀ·dy over many rows: k ≥ 1,024 and ≥ 4m), rather than into rows of its m. Cut by
    rows, every piece packs all of the (k, n) operand again: the step's 256 → 64 Linear's dW
    (m 256, k 4,096) took 7.0 ms a rule on one host core against 3.7 for the 64 → 256 Linear's
    of the same size (round 14, call 1); in round 14's last call the step took 21.48 ms at 16
    threads with this cut against 24.13 with round 13's (`results/round14/final/cpu`)."""
    return k >= 64 * team.MAX_PIECES and k >= 4 * m


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """a @ b in pieces: a 2-D product by rows of a (or, for a weight's gradient Aᵀ·dC with a
    long inner dimension, long_sum, by slices of that dimension, summed in order); a stacked
    (B, ..., M, K) @ (B, ..., K, N) product by its first dimension. None: not cut."""
    if not (type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == b.dtype == F32):
        return None
    if a.ndim == 2 and b.ndim == 2:
        (m, k), n = a.shape, b.shape[1]
        use = team.worth(m * k * n / MIN_MACS)
        if long_sum(m, k):  # long sums (dW = xᵀ·dy over 4,096 rows)
            cut = team.pieces(k, m * n, MIN_MACS, 64)
            if len(cut) > 1:
                return _sum_in_order(team.run_pieces(lambda s: a[:, s] @ b[s], cut, use))
        elif m >= 16 * team.MAX_PIECES:  # rows: each piece a (rows, K) @ (K, N) written in place
            cut = team.pieces(m, k * n, MIN_MACS, 8)
            if len(cut) > 1:
                out = np.empty((m, n), F32)
                team.run_pieces(lambda s: np.matmul(a[s], b, out=out[s]), cut, use)
                return out
        return None
    if a.ndim == b.ndim > 2 and a.shape[:-2] == b.shape[:-2]:  # attention's (B, H, T, ·) products
        each = int(np.prod(a.shape[1:-2])) * a.shape[-2] * a.shape[-1] * b.shape[-1]
        cut = team.pieces(a.shape[0], each, MIN_MACS)
        if len(cut) > 1:
            out = np.empty(a.shape[:-1] + (b.shape[-1],), F32)
            use = team.worth(a.shape[0] * each / MIN_MACS)
            team.run_pieces(lambda s: np.matmul(a[s], b[s], out=out[s]), cut, use)
            return out
    return None


def _plain(a: Any) -> bool:
    return type(a) is np.ndarray and a.dtype == F32 and a.flags.c_contiguous


def elementwise(ufunc: np.ufunc, a: Any, b: Any) -> np.ndarray | None:
    """ufunc(a, b) for a large contiguous float32 `a` and a `b` of a's shape (a residual), or
    a number, or one that broadcasts along a's rows (a bias), in pieces of a's first dimension.
    None: not cut (one thread, a small array, or another broadcast: NumPy's own)."""
    if not (_plain(a) and a.ndim >= 1 and team.size() > 1):
        return None
    same = isinstance(b, np.ndarray) and b.shape == a.shape
    if isinstance(b, np.ndarray):
        if not (b.dtype == F32 and (same or (b.ndim < a.ndim and a.shape[a.ndim - b.ndim:] == b.shape))):
            return None
    elif not (type(b) in (int, float) or type(b) is np.float32):  # np.float64 would upcast: NumPy's
        return None
    cut = team.pieces(a.shape[0], a.size // max(1, a.shape[0]), MIN_ITEMS)
    use = team.worth(a.size / MIN_ITEMS)
    if len(cut) < 2 or use < 2:
        return None
    out = np.empty_like(a)  # elementwise: the same bits however it is cut
    if same:
        team.run_pieces(lambda s: ufunc(a[s], b[s], out=out[s]), cut, use)
    else:
        team.run_pieces(lambda s: ufunc(a[s], b, out=out[s]), cut, use)
    return out


def sum_first(a: Any) -> np.ndarray | None:
    """a.sum(axis=0) for a large contiguous float32 `a` (a bias's gradient, summed over the
    rows): each piece's sum, then the pieces' sums added in order. None: not cut."""
    if not (_plain(a) and a.ndim >= 2):
        return None
    cut = team.pieces(a.shape[0], a.size // max(1, a.shape[0]), MIN_ITEMS)
    if len(cut) < 2:
        return None
    return _sum_in_order(team.run_pieces(lambda s: a[s].sum(axis=0), cut, team.worth(a.size / MIN_ITEMS)))


def adamw(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], ms: Sequence[np.ndarray],
          vs: Sequence[np.ndarray], steps: Sequence[int], lr: float, beta1: float, beta2: float,
          eps: float, weight_decays: Sequence[float], pool: Any = None) -> bool:
    """ArrayBackend.adamw_update's passes on every parameter (elementwise: the same bits however
    cut), the parameters cut into pieces shared over the team; with numba's kernels
    (compiled_passes.adamw) each piece is one loop that releases the GIL, the same bits again,
    and runs on one thread too; given `pool` (linear.jobs_pool()), those pieces are one job of
    the pool (compiled_jobs.py). False (nothing done): NumPy's passes on one thread, too little
    work, or an array that is not contiguous float32."""
    kernels = compiled.kernels()
    total = sum(p.size for p in params)
    passes = 1 if kernels else 8  # over memory per float: one loop, or NumPy's ~8
    shares = max(1, min(team.size(), total // MIN_ITEMS, team.worth(passes * total / MIN_ITEMS)))
    if (shares < 2 and not kernels) or not all(_plain(x) for x in (*params, *grads, *ms, *vs)):
        return False
    per = -(-total // shares)
    pieces = []  # ((p, g, m, v) flat views, t, wd): each parameter cut into shares' worth
    for p, g, m, v, t, wd in zip(params, grads, ms, vs, steps, weight_decays):
        flat = [x.reshape(-1) for x in (p, g, m, v)]
        for s in team.spans(p.size, -(-p.size // per)):
            pieces.append(([x[s] for x in flat], t, wd))
    groups: list[list] = [[] for _ in range(shares)]  # largest first, each to the least loaded
    loads = [0] * shares
    for piece in sorted(pieces, key=lambda q: -q[0][0].size):
        k = loads.index(min(loads))
        groups[k].append(piece)
        loads[k] += piece[0][0].size

    if kernels and pool is not None and _pooled_adamw(pool, pieces, beta1, beta2, eps, lr, shares):
        return True

    def update(group: list) -> None:
        for (p, g, m, v), t, wd in group:
            if kernels:  # the scalars as NumPy rounds a Python float beside float32 arrays
                kernels.adamw(p, g, m, v, F(beta1), F(1.0 - beta1), F(beta2), F(1.0 - beta2),
                              F(1.0 - beta2 ** t), F(eps), F(1.0 - lr * wd) if wd else F(1.0),
                              F(lr / (1.0 - beta1 ** t)))
                continue
            m *= beta1
            m += (1.0 - beta1) * g
            v *= beta2
            v += (1.0 - beta2) * (g * g)
            denom = np.sqrt(v / (1.0 - beta2 ** t))
            denom += eps
            if wd:
                p *= 1.0 - lr * wd  # decoupled decay reads the old p: first
            step = m * (lr / (1.0 - beta1 ** t))
            step /= denom
            p -= step

    team.run(update, [g for g in groups if g])
    return True


def _pooled_adamw(pool: Any, pieces: list, beta1: float, beta2: float, eps: float, lr: float,
                  threads: int) -> bool:
    """adamw's compiled pieces as one job of `pool` (compiled_jobs.py): each piece the same call
    with the same scalars. True if it ran (2 to pool.MAX_PIECES pieces)."""
    if not 2 <= len(pieces) <= pool.MAX_PIECES:
        return False
    from . import compiled_jobs, compiled_team

    table = np.array([[x.ctypes.data for x in flat] + [flat[0].size] for flat, _, _ in pieces], np.int64)
    scalars = np.array([[beta1, 1.0 - beta1, beta2, 1.0 - beta2, 1.0 - beta2 ** t, eps,
                         1.0 - lr * wd if wd else 1.0, lr / (1.0 - beta1 ** t)] for _, t, wd in pieces], F32)
    values = compiled_jobs.rows_values([table, scalars], len(pieces), 0)
    cuts = np.arange(len(pieces) + 1, dtype=np.int64)

    def publish(helpers: int, keep: Any = (pieces, table, scalars)) -> int:  # alive until the next job
        return pool.publish_job(helpers, values, compiled_team.ADAMW, cuts)
    team.pooled(publish, pool.finish, len(pieces), threads)
    return True

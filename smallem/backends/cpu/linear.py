"""A Linear layer on the float32 CPU engine: y = x·W + b (and y = r + x·W + b, `linear_add`) as
one run of the thread team, each piece of rows a product whose bias (and residual) is added while
the piece is still in cache; its rule as one run too, the pieces of dx = dy·Wᵀ beside those of
dW = Σ xᵀ·dy and of db = Σ dy. One run instead of three
(product, bias add, residual add; or two products and a column sum) is one wake-up of the team
and one wait for its last piece instead of three: on a 16-core host that hand-over, and the GIL
each NumPy call takes back, are what the step spends beside the arithmetic (issue 38).

operations.Linear and LinearAdd are the reference (matmul then add; the matmul's rule and the
sum over the rows): the forward and the rule give the unfused engine's bits (every product and sum cut
as products.py cuts it, the same float32 adds in the same order), so the same bits on any thread
count, and a CPU run's numbers do not change with the fusion (tests/test_cpu_linear.py).
Anything but contiguous float32, or too small to cut, declines. With numba and an OpenBLAS NumPy,
each thread runs its pieces in one compiled call that takes the GIL once (compiled_linear.py,
team.share: the same pieces, the same bits); else each piece is NumPy calls (team.run).
"""

from __future__ import annotations

import functools
import os
from typing import Any, NamedTuple

import numpy as np

from ...errors import SmallemError
from . import compiled, products, team
from .products import F32, _plain, _sum_in_order

# The compiled Linears' pieces on the spinning pool (compiled_team.py) or through team.share:
# "1" the pool on any team of 2 threads or more, "0" never; unset: from POOL_FROM threads. On the
# 16-core host, each row alone, the pool's step was 44.0 ms against 52.7 at 16 threads, and 32.0
# against 32.9 in a second call, but 62.7 against 53.4 on 2 pinned cores (round10/cpu_linear.md);
# with its helpers asleep in the loop (round 11) still 56.1 against 49.0 there (round11/cpu16.md);
# 3-15 threads were not measured, so they keep team.share.
POOL_ENV, POOL_FROM = "SMALLEM_POOL", 16
# Threads a pool job wakes: one per POOL_GRAIN units of its work (team.worth), where team.GRAIN
# (8) holds the runs whose pieces take the GIL. The pool's pieces take none: on the 16-core host
# 16 threads each calling one-thread sgemms from compiled loops ran them at 28.8 µs a call against
# 26.6 alone, where 16 Python threads calling np.matmul took 157.4 (round11/cpu16.md).
POOL_GRAIN_ENV, POOL_GRAIN = "SMALLEM_POOL_GRAIN", 1.0
# The fused attention's compiled blocks as jobs of the same pool (compiled_jobs.py, no GIL a
# block) where it runs: "1", or "0" (team.run, a Python call a block); unset: POOL_JOBS, "1": at 16
# threads on the 16-core host 25.5-28.1 ms a step against 29.7-34.1 with "0" (round11/cpu16b.md).
POOL_JOBS_ENV, POOL_JOBS = "SMALLEM_POOL_JOBS", "1"


def pool_grain() -> float:
    """SMALLEM_POOL_GRAIN (units of work a pool thread is woken for), else POOL_GRAIN."""
    return team.positive_env(POOL_GRAIN_ENV, POOL_GRAIN,
                             "the units of work (~20 µs each) worth one more thread of the pool")


def jobs_pool() -> Any:
    """The pool for the attention's blocks (SMALLEM_POOL_JOBS=1 and _pool() runs one), else None."""
    raw = os.environ.get(POOL_JOBS_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise SmallemError(f"{POOL_JOBS_ENV}={raw!r}: give 1 (the attention's blocks on the pool "
                           f"where it runs) or 0 (on the team's queues), or unset it for {POOL_JOBS}")
    if (raw or POOL_JOBS) != "1" or compiled.linear() is None:  # the pool runs compiled Linears
        return None  # only: without them (no numba, SMALLEM_LINEAR=numpy) there is none to join
    return _pool()


def _pool() -> Any:
    """The team's compiled pool (compiled_team.py), attached on first use, where SMALLEM_POOL
    (or POOL_FROM) asks for it on this team; else None (team.share)."""
    asked = os.environ.get(POOL_ENV, "").strip()
    if asked not in ("", "0", "1"):
        raise SmallemError(f"{POOL_ENV}={asked!r}: give 1 (the spinning pool) or 0 (none), or "
                           f"unset it for the pool from {POOL_FROM} threads")
    if team.size() < (2 if asked == "1" else POOL_FROM) or asked == "0":
        return None  # one thread: its loop called at once (team.share), nothing to publish
    if team._pool is None:
        from . import compiled_team

        team.attach(compiled_team.Pool(team.spin_us()))
    return team._pool


class Plan(NamedTuple):
    """A Linear's pieces, a function of its shape alone, made once a shape (round 15: ~60-90 µs
    of Python a rule and ~15 a forward when made at every call, ~1 ms of a one-thread step)."""
    rows: int
    cut: list[slice]  # the products' rows (products.matmul's: the same bits)
    edges: np.ndarray  # cut's starts and `rows`: the compiled forward's pieces
    jobs: list[tuple[str, slice]]  # the rule's (rule_jobs)
    table: np.ndarray  # jobs as compiled_linear's (kind, start, stop, slot) rows (never written)
    sums: int  # dW's partial products summed after (0: dW whole, or by rows of xᵀ)
    dbs: int  # db's partial sums


@functools.lru_cache(maxsize=256)
def _plan(rows: int, k: int, n: int, items: int, *knobs: int) -> Plan | None:
    """The Plan of (rows, K) @ (K, N) + b, x's first dimension `items`; None: not cut. `knobs`:
    the cuts' settings as they are now (tests and benchmarks change them), part of the key."""
    if rows < 16 * team.MAX_PIECES:  # few rows: products.matmul does not cut them either
        return None
    cut = team.pieces(rows, k * n, products.MIN_MACS, 8)
    if len(cut) < 2:
        return None
    jobs = rule_jobs(cut, k, n, items)
    slots = {"dw sum": 0, "db": 0}  # the partial sums' places, in the jobs' order
    table = np.empty((len(jobs), 4), np.int64)
    for i, (kind, s) in enumerate(jobs):
        table[i] = KINDS[kind], s.start, s.stop, slots.get(kind, 0)
        if kind in slots:
            slots[kind] += 1
    edges = np.array([c.start for c in cut] + [rows], np.int64)
    return Plan(rows, cut, edges, jobs, table, slots["dw sum"], slots["db"])


def _cut(x: Any, w: Any, b: Any) -> Plan | None:
    """The Plan when x (..., K) @ W (K, N) + b (N) is worth cutting."""
    if not (_plain(x) and _plain(w) and _plain(b) and x.ndim >= 2 and w.ndim == 2 and b.ndim == 1
            and x.shape[-1] == w.shape[0] and b.shape[0] == w.shape[1] and x.size and b.size):
        return None
    k, n = w.shape
    return _plan(x.size // k, k, n, x.shape[0], team.MAX_PIECES, products.MIN_MACS, products.MIN_ITEMS)


def _forward(x: Any, w: Any, b: Any, r: Any | None) -> np.ndarray | None:
    plan = _cut(x, w, b)
    if plan is None or (r is not None and not (_plain(r) and r.size == plan.rows * w.shape[1])):
        return None
    rows, cut = plan.rows, plan.cut
    k, n = w.shape
    x2, out = x.reshape(rows, k), np.empty((rows, n), F32)
    r2 = None if r is None else r.reshape(rows, n)
    fast = compiled.linear()
    if fast:  # each thread's pieces in one compiled call, the GIL taken once
        edges = plan.edges
        rr = out if r2 is None else r2  # unread without a residual: one signature to compile
        use = team.worth(rows * k * n / products.MIN_MACS)
        if (pool := _pool()) and len(cut) <= pool.MAX_PIECES:
            team.pooled(lambda helpers: pool.publish_forward(helpers, x2, w, b, rr, r2 is not None,
                                                             out, edges),
                        pool.finish, len(cut), team.worth(rows * k * n / products.MIN_MACS, pool_grain()))
        else:
            counter = np.zeros(1, np.int64)
            team.share(lambda: fast.linear_forward(x2, w, b, rr, r2 is not None, out, edges, counter),
                       len(cut), use)
        return out.reshape(x.shape[:-1] + (n,))
    kernels = compiled.kernels()

    def piece(s: slice) -> None:
        y = out[s]
        np.matmul(x2[s], w, out=y)
        if kernels:  # one pass, the GIL released: (y + b) + r, as the two NumPy adds below
            kernels.add_bias(y, b) if r2 is None else kernels.add_bias_residual(y, b, r2[s])
            return
        y += b
        if r2 is not None:
            y += r2[s]

    team.run_pieces(piece, cut, team.worth(rows * k * n / products.MIN_MACS))
    return out.reshape(x.shape[:-1] + (n,))


def linear_forward(be: Any, x: Any, w: Any, b: Any, op: Any) -> np.ndarray | None:
    """fused_forward["linear"]: x·W + b by pieces of rows, b added to each piece in cache."""
    return _forward(x, w, b, None)


def linear_add_forward(be: Any, x: Any, w: Any, b: Any, r: Any, op: Any) -> np.ndarray | None:
    """fused_forward["linear_add"]: r + (x·W + b), both adds on each piece in cache."""
    return _forward(x, w, b, r)


def _rule(grad: Any, x: Any, w: Any, b: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(dx, dW, db) as one run of the team, each cut as the unfused engine cuts it, so each is
    its bits: dx = dy·Wᵀ by rows (products.matmul), dW = xᵀ·dy by rows of xᵀ where it has many,
    else by slices of the rows summed in order (products.matmul), db by the first dimension of
    dy (products.sum_first), then over what is left (the tape's unbroadcast)."""
    plan = _cut(x, w, b)
    if plan is None or not (_plain(grad) and grad.shape == x.shape[:-1] + w.shape[1:]):
        return None
    rows, jobs = plan.rows, plan.jobs
    k, n = w.shape
    x2, g2, wt = x.reshape(rows, k), grad.reshape(rows, n), w.T
    xt = x2.T
    dx, dw = np.empty((rows, k), F32), np.empty((k, n), F32)

    use = team.worth(2 * rows * k * n / products.MIN_MACS)
    fast = compiled.linear()
    if fast:
        return _compiled_rule(fast, plan, grad, x2, g2, w, dx, dw, use, x.shape)

    def piece(job: tuple[str, slice]) -> Any:
        kind, s = job
        if kind == "dx":
            return np.matmul(g2[s], wt, out=dx[s])
        if kind == "dw rows":
            return np.matmul(xt[s], g2, out=dw[s])
        if kind == "dw sum":
            return xt[:, s] @ g2[s]
        return grad[s].sum(axis=0)

    done = team.run(piece, jobs, use)
    if plan.sums:
        dw = _sum_in_order([d for (kind, _), d in zip(jobs, done) if kind == "dw sum"])
    db = _sum_in_order([d for (kind, _), d in zip(jobs, done) if kind == "db"])
    return dx.reshape(x.shape), dw, _db_rest(db)


def rule_jobs(rows_dx: list[slice], k: int, n: int, items: int) -> list[tuple[str, slice]]:
    """A rule's pieces, (kind, slice): dx's rows (rows_dx, _cut's), dW's as products.matmul cuts
    xᵀ·dy, db's by dy's first dimension (`items` of rows / items rows each), in the order of the
    last row of dy each reads (dW's rows of xᵀ read all of dy: last), each kind's in its own
    order, so its partial sums keep their places and their bits. One thread then reads each
    slice of dy once from memory for its dx, dW and db, where it read all of dy three times
    (round 15, results/round15/cpu2)."""
    rows = rows_dx[-1].stop
    jobs: list[tuple[str, slice]] = [("dx", s) for s in rows_dx]
    if products.long_sum(k, rows):  # products.matmul's two cuts of xᵀ·dy, or none
        jobs += [("dw sum", s) for s in team.pieces(rows, k * n, products.MIN_MACS, 64)]
    elif k >= 16 * team.MAX_PIECES:
        jobs += [("dw rows", s) for s in team.pieces(k, rows * n, products.MIN_MACS, 8)]
    else:
        jobs.append(("dw rows", slice(0, k)))
    jobs += [("db", s) for s in team.pieces(items, rows * n // items, products.MIN_ITEMS)]

    def last(job: tuple[str, slice]) -> int:
        kind, s = job
        return rows if kind == "dw rows" else s.stop * (rows // items if kind == "db" else 1)
    return sorted(jobs, key=last)  # stable: ties keep dx, dW, db


def _db_rest(db: np.ndarray) -> np.ndarray:
    while db.ndim > 1:  # (T, N) left of a (B, T, N) dy: summed as the tape's unbroadcast does
        summed = products.sum_first(db)
        db = db.sum(axis=0) if summed is None else summed
    return db


KINDS = {"dx": 0, "dw rows": 1, "dw sum": 2, "db": 3}  # compiled_linear's DX, DW_ROWS, DW_SUM, DB


def _compiled_rule(fast: Any, plan: Plan, grad: np.ndarray, x2: np.ndarray, g2: np.ndarray,
                   w: np.ndarray, dx: np.ndarray, dw: np.ndarray, use: int, shape: tuple
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_rule's jobs as compiled_linear.linear_rule's table, each thread's pieces in one call."""
    jobs, table, sums = plan.jobs, plan.table, plan.sums
    k, n = w.shape
    pool = _pool()
    # one thread takes every piece, in order (team.share alone): its partial sums folded
    fold = not (pool and len(jobs) <= pool.MAX_PIECES) and team.share_helpers(len(jobs), use) < 1
    dw_parts = np.empty((max(1, min(sums, 2)) if fold else max(1, sums), k, n), F32)
    grads = grad.reshape(grad.shape[0], -1)
    db_parts = np.empty((min(plan.dbs, 2) if fold else plan.dbs, grads.shape[1]), F32)
    if pool and len(jobs) <= pool.MAX_PIECES:
        units = 2 * x2.shape[0] * k * n / products.MIN_MACS
        team.pooled(lambda helpers: pool.publish_rule(helpers, g2, x2, w, dx, dw, dw_parts, grads,
                                                      db_parts, table),
                    pool.finish, len(jobs), team.worth(units, pool_grain()))
        if sums > 1:  # the partial dWs added in order by rows of dW, on the pool too
            cuts = np.array([s.start for s in team.spans(k, team.MAX_PIECES)] + [k], np.int64)
            team.pooled(lambda helpers: pool.publish_sum(helpers, dw, dw_parts, cuts), pool.finish,
                        cuts.size - 1, team.worth(dw_parts.size / products.MIN_ITEMS, pool_grain()))
            sums = 0
    else:
        counter = np.zeros(1, np.int64)
        team.share(lambda: fast.linear_rule(g2, x2, w, dx, dw, dw_parts, grads, db_parts, table,
                                            counter, fold), len(jobs), use)
    add = compiled.kernels().sum_parts  # _sum_in_order's adds in one compiled loop
    if fold:  # added as they came: place 0 holds the sums
        dw = dw_parts[0] if sums else dw
        return dx.reshape(shape), dw, _db_rest(db_parts[0].reshape(grad.shape[1:]))
    if sums:
        dw = add(dw_parts.reshape(dw_parts.shape[0], -1)).reshape(k, n)
    db = add(db_parts).reshape(grad.shape[1:])
    return dx.reshape(shape), dw, _db_rest(db)


def linear_rule(be: Any, grad: Any, out: Any, x: Any, w: Any, b: Any, op: Any) -> tuple | None:
    """fused["linear"]: (dx, dW, db), one run of the team."""
    return _rule(grad, x, w, b)


def linear_add_rule(be: Any, grad: Any, out: Any, x: Any, w: Any, b: Any, r: Any, op: Any
                    ) -> tuple | None:
    """fused["linear_add"]: (dx, dW, db, dr = dy), one run of the team."""
    got = _rule(grad, x, w, b)
    return None if got is None else (*got, grad)


FUSED = {"linear": linear_rule, "linear_add": linear_add_rule}
FUSED_FORWARD = {"linear": linear_forward, "linear_add": linear_add_forward}

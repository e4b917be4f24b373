"""A Linear layer on the float32 CPU engine: y = x·W + b (and y = r + x·W + b, `linear_add`) as
one run of the thread team, each piece of rows a product whose bias (and residual) is added while
the piece is still in cache; its rule as one run too, the pieces of dx = dy·Wᵀ beside those of
dW = Σ xᵀ·dy, each dW piece summing its rows of dy for db on the way. One run instead of three
(product, bias add, residual add; or two products and a column sum) is one wake-up of the team
and one wait for its last piece instead of three: on a 16-core host that hand-over, and the GIL
each NumPy call takes back, are what the step spends beside the arithmetic (issue 38).

operations.Linear and LinearAdd are the reference (matmul then add; the matmul's rule and the
sum over the rows): the forward gives their bits (the product cut into the same rows as
products.matmul's, then the same float32 adds in the same order); the rule's dW and db add the
same rows in other groupings (float32 rounding), the same bits on any thread count, tested in
tests/test_cpu_linear.py. Anything but contiguous float32, or too small to cut, declines.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import compiled, products, team
from .products import F32, _plain, _sum_in_order


def _cut(x: Any, w: Any, b: Any) -> tuple[int, list[slice]] | None:
    """(rows, the products' row pieces) when x (..., K) @ W (K, N) + b (N) is worth cutting."""
    if not (_plain(x) and _plain(w) and _plain(b) and x.ndim >= 2 and w.ndim == 2 and b.ndim == 1
            and x.shape[-1] == w.shape[0] and b.shape[0] == w.shape[1] and x.size and b.size):
        return None
    k, n = w.shape
    rows = x.size // k
    if rows < 16 * team.MAX_PIECES:  # few rows: products.matmul does not cut them either
        return None
    cut = team.pieces(rows, k * n, products.MIN_MACS, 8)  # products.matmul's rows: the same bits
    return (rows, cut) if len(cut) > 1 else None


def _forward(x: Any, w: Any, b: Any, r: Any | None) -> np.ndarray | None:
    plan = _cut(x, w, b)
    if plan is None or (r is not None and not (_plain(r) and r.size == plan[0] * w.shape[1])):
        return None
    rows, cut = plan
    k, n = w.shape
    x2, out = x.reshape(rows, k), np.empty((rows, n), F32)
    r2 = None if r is None else r.reshape(rows, n)
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
    """(dx, dW, db) as one run of the team: the pieces of dx = dy·Wᵀ (rows, as products.matmul
    cuts them) and of dW, db (slices of the rows, each piece's xᵀ·dy and Σ dy, added in order)."""
    plan = _cut(x, w, b)
    if plan is None or not (_plain(grad) and grad.size == plan[0] * w.shape[1]):
        return None
    rows, rows_dx = plan
    k, n = w.shape
    x2, g2, wt = x.reshape(rows, k), grad.reshape(rows, n), w.T
    rows_dw = team.pieces(rows, k * n, products.MIN_MACS, 64)
    dx = np.empty((rows, k), F32)

    def piece(job: tuple[bool, slice]) -> Any:
        is_dx, s = job
        if is_dx:
            return np.matmul(g2[s], wt, out=dx[s])
        return x2[s].T @ g2[s], g2[s].sum(axis=0)

    jobs = [(False, s) for s in rows_dw] + [(True, s) for s in rows_dx]  # dW's first: the longer
    done = team.run(piece, jobs, team.worth(2 * rows * k * n / products.MIN_MACS))[:len(rows_dw)]
    dw = _sum_in_order([d for d, _ in done])
    db = _sum_in_order([s for _, s in done])
    return dx.reshape(x.shape), dw, db


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

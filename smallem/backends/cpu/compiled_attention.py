"""The fused attention's compiled blocks with their products in BLAS (issue 38, round 10): the
same (forward, rule) as compiled_kernels.attention_kernels, but each head's S = Q Kᵀ, O = P V
and the rule's dV, dP, dQ, dK are calls of the cblas_sgemm that compiled_linear.py found in
NumPy's own OpenBLAS, made from inside the numba block (one GIL a block, as before); the softmax
and its rule stay compiled loops over each head's (T, T) rows, in cache between the products.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from .compiled_kernels import JIT, ONE, ZERO, F, _exp, _row_max
from .compiled_linear import NO_TRANS, ROW_MAJOR, TRANS, _ptr, _sgemm

# queries (or keys) a product takes at once (causal: the keys past the last skipped). 64 (round
# 13, the attention alone on the host, round13/cpu.md): 3.14 ms at 16 threads against 6.37 for 16
# rows, 11.16 against 11.11 on one core; each sgemm call costs more with 16 threads calling, and
# 64 makes a quarter of them (round 10 had found 16 the fastest, by 13-18 % over 64). Round 13's
# last call measured the step with 16 beside it (round13/final/cpu); the switch that asked for
# another count was deleted in round 14.
ROWS = 64


def ready(*xs: np.ndarray) -> bool:
    """Every (B, H, T, D) float32 array has rows BLAS can read in place: D contiguous, each
    (b, h) matrix's rows `lead` floats apart, at least D (the heads' split views are H·D)."""
    return all(x.strides[3] == 4 and x.strides[2] % 4 == 0 and lead(x) >= x.shape[3] for x in xs)


def lead(x: np.ndarray) -> int:
    """The leading dimension (floats between rows) of x[b, h]; one row: D."""
    return x.strides[2] // 4 if x.shape[2] > 1 else x.shape[3]


@numba.njit(inline="always", **JIT)
def _softmax_row(row, i, keys, causal):
    """row[:keys] = e^(row − max) in place, 0 past the diagonal (causal: key j > query i); returns
    (the max, Σ e). One loop over all `keys` with a select, no slices: it vectorizes whole."""
    top = _row_max(row, i + 1 if causal else keys)
    total = ZERO
    for j in range(keys):
        e = _exp(row[j] - top) if (j <= i or not causal) else ZERO
        row[j] = e
        total += e
    return top, total


@numba.njit(**JIT)
def forward(q, k, v, scale, causal, out, lse, leads, rows):
    """O = softmax(q kᵀ·scale, causal) v and lse = log Σ e^s for a block of sequences (b, H, T,
    D) (cpu/attention.py's forward), one head at a time, `rows` queries at a time: their S by
    sgemm into a (T, T) scratch (causal: only the keys up to the last of them), each row's
    softmax in place, their O = P V by sgemm straight into out's rows, then 1/Σ per row.
    leads: q's, k's, v's and out's row strides in floats (lead())."""
    t, d = q.shape[2], q.shape[3]
    s, inv = np.empty((t, t), F), np.empty(t, F)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            qh, kh, vh, o = q[b, h], k[b, h], v[b, h], out[b, h]
            for a in range(0, t, rows):
                z = min(t, a + rows)
                keys = z if causal else t
                _sgemm(ROW_MAJOR, NO_TRANS, TRANS, z - a, keys, d, scale, _ptr(qh[a:]), leads[0],
                       _ptr(kh), leads[1], ZERO, _ptr(s[a:]), t)
                for i in range(a, z):
                    top, total = _softmax_row(s[i], i, keys, causal)
                    inv[i] = ONE / total
                    lse[b, h, i, 0] = top + F(math.log(total))
                _sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, z - a, d, keys, ONE, _ptr(s[a:]), t, _ptr(vh),
                       leads[2], ZERO, _ptr(o[a:]), leads[3])
            for i in range(t):
                for c in range(d):
                    o[i, c] *= inv[i]


@numba.njit(**JIT)
def rule(q, k, v, grad, out, lse, scale, causal, dq, dk, dv, leads, rows):
    """FlashAttention's backward for a block of sequences, one head at a time: P = exp(q kᵀ·scale
    − lse) again (sgemm, then the rows); dP = dO Vᵀ; dS = P ⊙ (dP − δ), δ = rowsum(dO ⊙ O);
    dQ = dS K·scale, `rows` queries at a time; dV = Pᵀ dO and dK = dSᵀ Q·scale, `rows` keys at a
    time (causal: only the queries from the first of them on; P and dS are 0 above the diagonal).
    Each product one sgemm into the outputs' rows. leads: row strides in floats of q, k, v, grad,
    out, dq, dk, dv."""
    t, d = q.shape[2], q.shape[3]
    p, ds = np.empty((t, t), F), np.empty((t, t), F)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            qh, kh, vh, do, o = q[b, h], k[b, h], v[b, h], grad[b, h], out[b, h]
            for a in range(0, t, rows):
                z = min(t, a + rows)
                keys = z if causal else t
                _sgemm(ROW_MAJOR, NO_TRANS, TRANS, z - a, keys, d, scale, _ptr(qh[a:]), leads[0],
                       _ptr(kh), leads[1], ZERO, _ptr(p[a:]), t)
                _sgemm(ROW_MAJOR, NO_TRANS, TRANS, z - a, keys, d, ONE, _ptr(do[a:]), leads[3],
                       _ptr(vh), leads[2], ZERO, _ptr(ds[a:]), t)
                for i in range(a, z):
                    m = lse[b, h, i, 0]
                    delta = ZERO
                    for c in range(d):
                        delta += do[i, c] * o[i, c]
                    row, drow = p[i], ds[i]
                    for j in range(keys):
                        pj = _exp(row[j] - m) if (j <= i or not causal) else ZERO
                        row[j] = pj
                        drow[j] = pj * (drow[j] - delta)
                _sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, z - a, d, keys, scale, _ptr(ds[a:]), t,
                       _ptr(kh), leads[1], ZERO, _ptr(dq[b, h, a:]), leads[5])
            for a in range(0, t, rows):
                z = min(t, a + rows)
                first = a if causal else 0
                _sgemm(ROW_MAJOR, TRANS, NO_TRANS, z - a, d, t - first, ONE, _ptr(p[first:, a:]), t,
                       _ptr(do[first:]), leads[3], ZERO, _ptr(dv[b, h, a:]), leads[7])
                _sgemm(ROW_MAJOR, TRANS, NO_TRANS, z - a, d, t - first, scale, _ptr(ds[first:, a:]),
                       t, _ptr(qh[first:]), leads[0], ZERO, _ptr(dk[b, h, a:]), leads[6])


ALL = {"attention_forward": forward, "attention_rule": rule, "ready": ready, "lead": lead,
       "ROWS": ROWS}

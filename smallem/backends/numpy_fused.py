"""The float32 CPU's fused table: softmax, LayerNorm, GELU and cross-entropy a block of rows at a time.

numpy.py puts these in `NumpyBackend.fused` / `fused_forward` (float32 only; cpu64 runs every
reference rule). Each entry computes its reference's numbers with the same operations, but on
blocks of rows that stay in the core's cache, in place, and on several threads at once: NumPy
releases the GIL inside each call. It takes contiguous float32 arrays and declines the rest.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .array import GELU_CUBIC, GELU_SCALE

F32 = np.dtype(np.float32)
SPREAD = 60.0  # softmax: e^−60 ≈ 1e-26, far from float32's smallest normal number (e^−87)
PARALLEL = 1 << 17  # elementwise: arrays of fewer floats take longer to split than to compute
BLOCK = 1 << 15  # floats per block of rows: 128 KB, a few live copies stay in a 1-2 MB L2 cache


def threads() -> int:
    """Threads for the blocks: what NumPy's BLAS is told (OPENBLAS_NUM_THREADS, then
    OMP_NUM_THREADS), else the CPUs this process may run on."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _Team:
    """threads() − 1 helper threads and the caller, taking blocks from one counter. The caller
    works too and waits only for blocks already taken: on a busy machine where a helper is
    not scheduled, the caller does its share instead of waiting for it to start."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pool = ThreadPoolExecutor(size - 1, thread_name_prefix="smallem-cpu")

    def run(self, fn: Callable[[slice], Any], blocks: list[slice]) -> list[Any]:
        results: list[Any] = [None] * len(blocks)
        errors: list[BaseException] = []
        claims = itertools.count()  # next() on it is atomic under the GIL
        left, lock, done = [len(blocks)], threading.Lock(), threading.Event()

        def drain() -> None:
            while (k := next(claims)) < len(blocks):
                try:
                    results[k] = fn(blocks[k])
                except BaseException as error:  # re-raised by the caller, below
                    errors.append(error)
                with lock:
                    left[0] -= 1
                    if not left[0]:
                        done.set()

        for _ in range(min(self.size, len(blocks)) - 1):
            self.pool.submit(drain)
        drain()
        done.wait()
        if errors:
            raise errors[0]
        return results


_teams: dict[int, _Team] = {}  # process id -> its team: a forked child makes its own


def each(fn: Callable[[slice], Any], rows: int, width: int, multiple: int = 1,
         step: int | None = None) -> list[Any]:
    """fn(s) for consecutive blocks s of `rows` rows of `width` floats (each block a multiple
    of `multiple` rows, or `step` rows), on threads() threads; the results in block order."""
    step = step or max(1, BLOCK // max(1, width * multiple)) * multiple
    blocks = [slice(i, min(i + step, rows)) for i in range(0, rows, step)]
    if len(blocks) == 1 or threads() == 1:
        return [fn(s) for s in blocks]
    team = _teams.get(os.getpid())
    if team is None:
        team = _teams[os.getpid()] = _Team(threads())
    return team.run(fn, blocks)


def row_max(a: np.ndarray) -> np.ndarray:
    """a.max(axis=-1, keepdims=True) for rows (N, W): the same maxima, but NumPy's reduction
    along short rows is slow (2.8 ms for 16384 × 64 here), and halving W elementwise is not."""
    if a.shape[-1] > 128:
        return a.max(axis=-1, keepdims=True)
    m = a
    while m.shape[-1] > 1:
        half = m.shape[-1] // 2
        top = np.maximum(m[:, :half], m[:, half:2 * half])
        if m.shape[-1] % 2:  # an odd column left over joins the first
            np.maximum(top[:, :1], m[:, 2 * half:], out=top[:, :1])
        m = top
    return m


def plain(*arrays: Any) -> bool:
    """Contiguous float32 NumPy arrays, none empty: what these blocks read."""
    return all(type(a) is np.ndarray and a.dtype == F32 and a.flags.c_contiguous and a.size
               for a in arrays)


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


def elementwise(ufunc: Any, a: Any, b: Any) -> np.ndarray | None:
    """ufunc(a, b) on threads for a large float32 `a` and a `b` of its shape, a trailing block of
    it (a bias row, positions) or one number; the same numbers as ufunc(a, b). None: anything
    else, or one thread (nothing to gain)."""
    if not (plain(a) and a.size >= PARALLEL and threads() > 1):
        return None
    if isinstance(b, float) or (type(b) is np.ndarray and b.dtype == F32 and b.size == 1):
        width, rhs = a.shape[-1], b
    elif (type(b) is np.ndarray and b.dtype == F32 and b.flags.c_contiguous and b.size
          and b.ndim <= a.ndim and b.shape == a.shape[a.ndim - b.ndim:]):
        width, rhs = b.size, b.reshape(-1)
    else:
        return None
    out = np.empty_like(a)
    a2, o2 = a.reshape(-1, width), out.reshape(-1, width)
    if getattr(rhs, "size", 1) == a.size:  # the same shape: split it too
        r2 = rhs.reshape(-1, width)
        each(lambda s: ufunc(a2[s], r2[s], out=o2[s]), len(a2), width)
    else:
        each(lambda s: ufunc(a2[s], rhs, out=o2[s]), len(a2), width)
    return out


def batched_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """a @ b for stacks (..., M, K) @ (..., K, N) with the same leading dims (attention's
    (B, H, T, D) products) on several threads: each product is too small for BLAS to thread,
    so two blocks of the first dimension per thread run at once (None: anything else, or one
    thread, where NumPy's own loop is quicker than blocks)."""
    n = threads()
    if not (n > 1 and type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == b.dtype == F32
            and a.ndim == b.ndim > 2 and a.shape[:-2] == b.shape[:-2] and a.size and b.size
            and a.shape[-1] == b.shape[-2]):
        return None
    if b.strides[-2] == b.itemsize and b.shape[-1] > 1:  # a transposed right-hand side (kᵀ,
        b = np.ascontiguousarray(b)  # vᵀ): its copy costs less than the slower products
    out = np.empty(a.shape[:-1] + b.shape[-1:], dtype=F32)
    each(lambda s: np.matmul(a[s], b[s], out=out[s]), len(out), 1, step=-(-len(out) // (2 * n)))
    return out


# mul (primitives): the scale's gradient as one dot product -------------------------------------
def mul_rule(be: Any, grad: np.ndarray, out: Any, a: Any, b: Any) -> tuple | None:
    """fused["mul"] for x·s, s one number (attention's 1/√D): dx = dc·s, ds = Σ dc·x as one
    dot product, with no dc·x array in between. Anything else declines."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and b.size == 1
            and plain(grad, a) and a.shape == grad.shape and b.dtype == F32):
        return None
    return grad * b, np.asarray(np.vdot(grad, a), dtype=F32).reshape(b.shape)


# softmax (operations.Softmax) ----------------------------------------------------------------
def softmax_forward(be: Any, x: np.ndarray, op: Any) -> np.ndarray | None:
    """fused_forward["softmax"]: exp(x + mask − m) ÷ its sum, in place on each block. Any shift m
    gives the same softmax; the reference's row max costs two passes, so a block whose entries lie
    within SPREAD of each other is shifted by its largest entry (exp stays within [e^−SPREAD, 1])."""
    if not plain(x):
        return None
    n = x.shape[-1]
    causal = op.causal
    mask = op.mask(be, n) if causal else None
    xs, y = _rows(x), np.empty_like(x)
    ys = _rows(y)

    def block(s: slice) -> None:
        out, raw = ys[s], xs[s]
        top, low = raw.max(), raw.min()  # whole-block reductions: fast, unlike per-row ones
        if top - low <= SPREAD:  # one shift for the block (a row's own max is ≥ top − SPREAD)
            if causal:  # the mask, shifted, in the same pass; a block holds whole (T, T) matrices
                np.add(raw.reshape(-1, n, n), mask - top, out=out.reshape(-1, n, n))
            else:
                np.subtract(raw, top, out=out)
        else:  # logits far apart: each row shifted by its own max, as the reference does
            if causal:
                np.add(raw.reshape(-1, n, n), mask, out=out.reshape(-1, n, n))
            else:
                out[...] = raw
            out -= row_max(out)
        np.exp(out, out=out)
        out /= _row_sums(out)

    each(block, len(xs), n, n if causal else 1)
    return y


def softmax_rule(be: Any, grad: np.ndarray, out: np.ndarray, x: np.ndarray, op: Any
                 ) -> tuple | None:
    """fused["softmax"]: dx = s ⊙ (g − Σ g·s), one pass of temporaries per block."""
    if not (plain(grad, out) and grad.shape == out.shape):
        return None
    gs, ss, dx = _rows(grad), _rows(out), np.empty_like(out)
    dxs = _rows(dx)

    def block(s: slice) -> None:
        d = dxs[s]
        np.multiply(gs[s], ss[s], out=d)
        total = _row_sums(d)
        np.subtract(gs[s], total, out=d)
        d *= ss[s]

    each(block, len(gs), gs.shape[-1])
    return (dx,)


# LayerNorm (operations.LayerNorm) ------------------------------------------------------------
def _row_sums(a: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Σⱼ a[i, j] (times weights[j]) for every row i, as a column (N, 1): NumPy's own reduction
    along short rows costs 2-3 times einsum's loop."""
    sums = np.einsum("ij->i", a) if weights is None else np.einsum("ij,j->i", a, weights)
    return sums[:, None]


def _normalize(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """x̂ and 1/√(var + ε) of a block of rows (N, C), as LayerNorm.normalize computes them."""
    c = x.shape[-1]
    xhat = x - _row_sums(x) / c
    scale = (np.einsum("ij,ij->i", xhat, xhat) / c)[:, None]
    scale += eps
    np.sqrt(scale, out=scale)
    np.divide(1.0, scale, out=scale)
    xhat *= scale
    return xhat, scale


def _layer_norm_fits(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> bool:
    return plain(x, w, b) and w.shape == b.shape == (x.shape[-1],)


def layer_norm_forward(be: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray, op: Any
                       ) -> np.ndarray | None:
    """fused_forward["layer_norm"]: y = x̂·w + b, block by block."""
    if not _layer_norm_fits(x, w, b):
        return None
    xs, y = _rows(x), np.empty_like(x)
    ys = _rows(y)

    def block(s: slice) -> None:
        xhat, _ = _normalize(xs[s], op.eps)
        np.multiply(xhat, w, out=ys[s])
        ys[s] += b

    each(block, len(xs), xs.shape[-1])
    return y


def layer_norm_rule(be: Any, grad: np.ndarray, out: np.ndarray, x: np.ndarray, w: np.ndarray,
                    b: np.ndarray, op: Any) -> tuple | None:
    """fused["layer_norm"]: dx = (1/σ)(g − mean g − x̂·mean(g·x̂)), g = dy·w, x̂ recomputed;
    mean(g·x̂) read off dy·x̂, which dw needs anyway; dw = Σ dy·x̂ and db = Σ dy summed over
    the rows here (each block's sum, added in order)."""
    if not (_layer_norm_fits(x, w, b) and plain(grad) and grad.shape == x.shape):
        return None
    xs, dys, dx = _rows(x), _rows(grad), np.empty_like(x)
    dxs = _rows(dx)
    c = x.shape[-1]

    def block(s: slice) -> tuple[np.ndarray, np.ndarray]:
        xhat, scale = _normalize(xs[s], op.eps)
        dy, d = dys[s], dxs[s]
        projected = dy * xhat  # dy·x̂: its rows give mean(g·x̂), its columns dw
        mean_projection = _row_sums(projected, w) / c
        np.multiply(dy, w, out=d)  # g
        d -= _row_sums(dy, w) / c  # − mean g
        xhat *= mean_projection
        d -= xhat
        d *= scale
        return np.einsum("ij->j", projected), np.einsum("ij->j", dy)

    parts = each(block, len(xs), c)
    dw, db = parts[0]
    for pw, pb in parts[1:]:
        dw += pw
        db += pb
    return dx, dw, db


# GELU (primitives' gelu; the backend's gelu and gelu_slope) ------------------------------------
U_CUBIC = GELU_SCALE * GELU_CUBIC  # u = a·(√(2/π) + √(2/π)·0.044715·a²): constants folded,
SLOPE_CUBIC = 1.5 * U_CUBIC  # and ½a·u′ = a·(½√(2/π) + 1.5·√(2/π)·0.044715·a²)


def _tanh_u(a: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = t = tanh(√(2/π)(a + 0.044715a³)), in four passes and a tanh; returns a² (a new
    array), which the slope needs too."""
    a2 = a * a
    np.multiply(a2, U_CUBIC, out=out)
    out += GELU_SCALE
    out *= a
    np.tanh(out, out=out)
    return a2


def gelu(a: np.ndarray) -> np.ndarray | None:
    """The float32 CPU's gelu, ½a(1 + t), block by block (None: not a plain float32 array)."""
    if not plain(a):
        return None
    flat, y = a.reshape(-1), np.empty_like(a)
    ys = y.reshape(-1)

    def block(s: slice) -> None:
        out = ys[s]
        _tanh_u(flat[s], out)
        out += 1.0
        out *= flat[s]
        out *= 0.5

    each(block, flat.size, 1)
    return y


def gelu_rule(be: Any, grad: np.ndarray, out: np.ndarray, a: np.ndarray) -> tuple | None:
    """fused["gelu"]: da = dc·(½(1 + t) + k(1 − t²)), k = ½a·u′, t recomputed from a."""
    if not (plain(grad, a) and grad.shape == a.shape):
        return None
    fa, fg, da = a.reshape(-1), grad.reshape(-1), np.empty_like(a)
    fd = da.reshape(-1)

    def block(s: slice) -> None:
        t = fd[s]
        k = _tanh_u(fa[s], t)  # t; k starts as a²
        k *= SLOPE_CUBIC
        k += 0.5 * GELU_SCALE
        k *= fa[s]  # k = ½a·u′
        q = t * t
        np.subtract(1.0, q, out=q)
        q *= k  # k(1 − t²)
        t *= 0.5
        t += 0.5
        t += q
        t *= fg[s]

    each(block, fa.size, 1)
    return (da,)


# cross-entropy (operations.CrossEntropy) ------------------------------------------------------
def cross_entropy_forward(be: Any, logits: np.ndarray, op: Any) -> Any:
    """fused_forward["cross_entropy"]: the mean of log Σ exp(z) − z[target], z = x − max, in
    fewer passes over the logits than the reference's log-softmax."""
    if not plain(logits):
        return None
    x, targets = _rows(logits), op.target_index(be).reshape(-1)

    def block(s: slice) -> Any:
        z = x[s] - row_max(x[s])
        picked = np.take_along_axis(z, targets[s, None], axis=1)[:, 0]
        np.exp(z, out=z)
        return np.sum(np.log(z.sum(axis=1)) - picked)

    return np.float32(sum(each(block, len(x), x.shape[1])) / len(x))


def cross_entropy_rule(be: Any, grad: Any, out: Any, logits: np.ndarray, op: Any) -> Any:
    """fused["cross_entropy"]: softmax in place, minus one at the targets, times dc/N (the
    reference recomputes the log-softmax and builds a one-hot: about twice the time)."""
    if not plain(logits):
        return None
    x, targets = _rows(logits), op.target_index(be).reshape(-1)
    p = np.empty_like(x)
    scale = grad / len(x)

    def block(s: slice) -> None:
        q = p[s]
        np.subtract(x[s], row_max(x[s]), out=q)
        np.exp(q, out=q)
        q /= q.sum(axis=1, keepdims=True)
        q[np.arange(len(q)), targets[s]] -= 1.0
        q *= scale

    each(block, len(x), x.shape[1])
    return (p.reshape(logits.shape),)


FUSED = {"mul": mul_rule, "softmax": softmax_rule, "layer_norm": layer_norm_rule, "gelu": gelu_rule,
         "cross_entropy": cross_entropy_rule}
FUSED_FORWARD = {"softmax": softmax_forward, "layer_norm": layer_norm_forward,
                 "cross_entropy": cross_entropy_forward}

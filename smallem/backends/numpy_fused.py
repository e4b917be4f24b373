"""The float32 CPU's fused table (numpy.py; cpu64 runs every reference rule): softmax, LayerNorm,
GELU, cross-entropy and the scale's mul, each its reference's numbers up to float32 rounding in
fewer passes, in place, on blocks of rows that stay in cache. Contiguous float32 arrays only; the
rest declines. Why and by how much: benchmarks/results/round4/cpu_step_notes.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .array import GELU_CUBIC, GELU_SCALE
from .cpu import compiled, linear, team

F32 = np.dtype(np.float32)
SPREAD = 60.0  # softmax: e^−60 ≈ 1e-26, far from float32's smallest normal number (e^−87)
BLOCK = 1 << 16  # floats per block of rows: 256 KB, a few live copies stay in a 2 MB L2 cache
# floats a block holds at least where an array is cut finer than BLOCK: an array of fewer than
# team.MAX_PIECES BLOCKs (the step's LayerNorms: 4,096 × 64, four BLOCKs) is cut into up to
# MAX_PIECES blocks of at least LEAST floats, so that 16 threads find work (round 14: the
# LayerNorm took ~0.2 ms a call at 16 threads on its four blocks, ~0.26 on one thread)
LEAST = 1 << 14
PASSES = 6  # NumPy calls a block takes, about: its work in the team's units (team.worth)


def each(fn: Callable[[slice], Any], rows: int, width: int, multiple: int = 1, passes: int = PASSES
         ) -> list[Any]:
    """fn(s) for consecutive blocks s of `rows` rows of `width` floats (each block a multiple
    of `multiple` rows); the results in block order. The blocks depend on the shape alone; a
    team of threads (cpu/team.py) shares them, each thread a run of consecutive blocks (`passes`:
    a block's work in passes over it, which says how many threads it is worth)."""
    return team.run_pieces(fn, _cut(rows, width, multiple), team.worth(passes * rows * width / BLOCK))


def _cut(rows: int, width: int, multiple: int = 1) -> list[slice]:
    """Blocks of BLOCK floats, or of rows / MAX_PIECES where that is less (but LEAST or more):
    a function of the shape alone, as the blocks' sums' bits need."""
    unit = max(1, width * multiple)  # floats in one multiple of rows
    most, least = max(1, BLOCK // unit), max(1, LEAST // unit)
    step = min(most, max(least, -(-rows // (multiple * team.MAX_PIECES)))) * multiple
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


def _pooled(kind: str, arrays: list[np.ndarray], rows: int, width: int, passes: int,
            eps: Any = None, backward: bool = False) -> np.ndarray | bool:
    """each()'s compiled blocks as one job of the pool (cpu/compiled_jobs.py: no GIL a block)
    where SMALLEM_POOL_JOBS asks and the pool runs; False where not (each() runs them). The
    LayerNorm rule's blocks' (Σ dy·x̂, Σ dy), an array (blocks, 2, C), and the cross-entropy's
    blocks' sums, (blocks,) float64 as team.run's Python floats, are returned."""
    pool = linear.jobs_pool()
    cut = _cut(rows, width)
    if pool is None or len(cut) > pool.MAX_PIECES:
        return False
    from .cpu import compiled_jobs, compiled_team

    factor = np.array([0 if eps is None else eps], F32)  # LayerNorm's eps; the cross-entropy rule's scale
    if kind in ("LAYER_NORM_RULE", "CROSS_ENTROPY"):
        arrays = arrays + [np.empty((len(cut), 2, width), F32) if kind == "LAYER_NORM_RULE"
                           else np.empty(len(cut))]  # the cross-entropy's sums, Python's floats
    values = compiled_jobs.rows_values(arrays, rows, width, factor, backward)
    cuts = compiled_jobs.cuts_of(cut)

    def publish(helpers: int, keep: Any = (arrays, factor)) -> int:  # keep: alive until the next job
        return pool.publish_job(helpers, values, getattr(compiled_team, kind), cuts)
    team.pooled(publish, pool.finish, len(cut),
                team.worth(passes * rows * width / BLOCK, linear.pool_grain()))
    return arrays[-1] if kind in ("LAYER_NORM_RULE", "CROSS_ENTROPY") else True


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


def _row_sums(a: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Σⱼ a[i, j] (times weights[j]) for every row i, as a column (N, 1): NumPy's own reduction
    along short rows costs 2-3 times einsum's loop."""
    sums = np.einsum("ij->i", a) if weights is None else np.einsum("ij,j->i", a, weights)
    return sums[:, None]


PAGE, NEAR = 4096, 1024  # 4K aliasing: addresses compared by their low 12 bits, over ~1 KB of stores


def backward(out: np.ndarray, *ins: np.ndarray) -> bool:
    """Whether an elementwise pass out[i] = f(ins[i]) should run from its last element: when out
    lies 1 to NEAR bytes ahead of an input modulo 4 KiB, and behind none. Intel cores take a load
    whose address matches a pending store's in its low 12 bits for one that depends on it ("4K
    aliasing"); forward, each store to out[i] then holds up the loads of that input just ahead,
    backward the loads just behind. The host ran GELU's compiled pass 3.2× slower into a buffer
    kept across calls than into a fresh one, the likely cause of its 8.3 ms GELU in round 9
    (benchmarks/results/round10/cpu_kernels.md); either order gives the same numbers."""
    ahead = [(out.ctypes.data - x.ctypes.data) % PAGE for x in ins]
    return any(0 < d <= NEAR for d in ahead) and not any(d >= PAGE - NEAR for d in ahead)


def plain(*arrays: Any) -> bool:
    """Contiguous float32 NumPy arrays, none empty: what these blocks read."""
    return all(type(a) is np.ndarray and a.dtype == F32 and a.flags.c_contiguous and a.size
               for a in arrays)


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


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
    """fused["softmax"]: dx = s ⊙ (g − Σ g·s), block by block in dx's own memory."""
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
    if kernels := compiled.kernels():  # one compiled pass a block (cpu/compiled.py)
        eps = np.float32(op.eps)
        if not _pooled("LAYER_NORM", [xs, w, b, ys], len(xs), xs.shape[-1], 2, eps):
            each(lambda s: kernels.layer_norm(xs[s], w, b, eps, ys[s]), len(xs), xs.shape[-1], passes=2)
        return y

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
    if kernels := compiled.kernels():
        eps = np.float32(op.eps)
        parts = _pooled("LAYER_NORM_RULE", [xs, dys, w, dxs], len(xs), c, 3, eps)
        if parts is False:
            parts = each(lambda s: kernels.layer_norm_rule(xs[s], dys[s], w, eps, dxs[s]), len(xs), c,
                         passes=3)
    else:
        parts = each(_layer_norm_block(xs, dys, w, dxs, op.eps), len(xs), c)
    dw, db = parts[0][0].copy(), parts[0][1].copy()  # parts: the blocks' (Σ dy·x̂, Σ dy)
    for pw, pb in parts[1:]:
        dw += pw
        db += pb
    return dx, dw, db


def _layer_norm_block(xs: np.ndarray, dys: np.ndarray, w: np.ndarray, dxs: np.ndarray, eps: float
               ) -> Callable[[slice], tuple[np.ndarray, np.ndarray]]:
    """The NumPy route's LayerNorm rule on one block of rows: its dx in place, (dw, db) returned."""
    c = xs.shape[-1]

    def block(s: slice) -> tuple[np.ndarray, np.ndarray]:
        xhat, scale = _normalize(xs[s], eps)
        dy, d = dys[s], dxs[s]
        projected = dy * xhat  # dy·x̂: its rows give mean(g·x̂), its columns dw
        mean_projection = _row_sums(projected, w) / c
        np.multiply(dy, w, out=d)  # g
        d -= _row_sums(dy, w) / c  # − mean g
        xhat *= mean_projection
        d -= xhat
        d *= scale
        return np.einsum("ij->j", projected), np.einsum("ij->j", dy)

    return block


# GELU (primitives' gelu; the backend's gelu and gelu_slope) ------------------------------------
U_CUBIC = GELU_SCALE * GELU_CUBIC  # the rule's u = a·(√(2/π) + √(2/π)·0.044715·a²), folded,
SLOPE_CUBIC = 1.5 * U_CUBIC  # and its ½a·u′ = a·(½√(2/π) + 1.5·√(2/π)·0.044715·a²)


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
    """The float32 CPU's gelu, block by block: ArrayBackend.gelu's operations in the output's
    own memory, no temporaries (None: not a plain float32 array)."""
    if not plain(a):
        return None
    flat, y = a.reshape(-1), np.empty_like(a)
    ys = y.reshape(-1)
    if kernels := compiled.kernels():
        back = backward(ys, flat)
        if not _pooled("GELU", [flat, ys], flat.size, 1, 2, backward=back):
            each(lambda s: kernels.gelu(flat[s], ys[s], back), flat.size, 1, passes=2)
        return y

    def block(s: slice) -> None:
        x, out = flat[s], ys[s]
        np.multiply(x, x, out=out)
        out *= GELU_CUBIC
        out += 1.0
        out *= x
        out *= GELU_SCALE
        np.tanh(out, out=out)
        out += 1.0
        out *= x
        out *= 0.5

    each(block, flat.size, 1)
    return y


def gelu_rule(be: Any, grad: np.ndarray, out: np.ndarray, a: np.ndarray) -> tuple | None:
    """fused["gelu"]: da = dc·(½(1 + t) + k(1 − t²)), k = ½a·u′, t recomputed from a."""
    if not (plain(grad, a) and grad.shape == a.shape):
        return None
    fa, fg, da = a.reshape(-1), grad.reshape(-1), np.empty_like(a)
    fd = da.reshape(-1)
    if kernels := compiled.kernels():
        back = backward(fd, fa, fg)
        if not _pooled("GELU_RULE", [fa, fg, fd], fa.size, 1, 3, backward=back):
            each(lambda s: kernels.gelu_rule(fa[s], fg[s], fd[s], back), fa.size, 1, passes=3)
        return (da,)

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
    if kernels := compiled.kernels():
        parts = _pooled("CROSS_ENTROPY", [x, targets], len(x), x.shape[1], 2)
        if parts is False:
            parts = each(lambda s: kernels.cross_entropy(x[s], targets[s]), len(x), x.shape[1], passes=2)
        return np.float32(sum(parts) / len(x))

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
    if kernels := compiled.kernels():
        k = np.float32(scale)
        if not _pooled("CROSS_ENTROPY_RULE", [x, targets, p], len(x), x.shape[1], 2, k):
            each(lambda s: kernels.cross_entropy_rule(x[s], targets[s], k, p[s]), len(x), x.shape[1],
                 passes=2)
        return (p.reshape(logits.shape),)

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

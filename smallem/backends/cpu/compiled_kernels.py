"""numba's kernels for compiled.py (imported only when that route is chosen and numba is there):
one block of rows each, the GIL released for the whole block, float32 throughout. exp is written
in plain arithmetic (Cephes' expf: a polynomial and a power of two built from its bits), and
GELU's tanh from it (1 − 2/(e^(2u) + 1)), because PyPI's llvmlite has no SVML, and numba's math.exp and
math.tanh were 7.6-12.5× slower than NumPy's SIMD loops (issue 38); this way every loop vectorizes.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..array import GELU_CUBIC, GELU_SCALE
from . import compiled_cache  # noqa: F401  (numba's cache keyed on every compiled*.py: first)

F = np.float32
FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}  # no "nnan"/"ninf": the mask's −∞ is real
JIT = {"nogil": True, "fastmath": FAST, "cache": True, "error_model": "numpy", "boundscheck": False}

LOG2E, LN2_HI, LN2_LO = F(1.4426950408889634), F(0.693359375), F(-2.12194440e-4)
EXP_LOW, EXP_HIGH = F(-87.3), F(88.0)  # float32 normals below; 2^127 above (e^88.0 clipped there)
P0, P1, P2, P3, P4, P5 = (F(1.9875691500e-4), F(1.3981999507e-3), F(8.3334519073e-3),
                          F(4.1665795894e-2), F(1.6666665459e-1), F(5.0000001201e-1))
ZERO, HALF, ONE = F(0.0), F(0.5), F(1.0)
BIAS, MANTISSA = np.int32(127), np.int32(23)  # float32's exponent: 2^n has bits (n + 127) << 23
MASKED = F(-np.inf)  # a causal mask's score: e^−∞ = 0 (_exp gives 0 below EXP_LOW)
TWO_SCALE, TWO_CUBIC = F(2 * GELU_SCALE), F(2 * GELU_SCALE * GELU_CUBIC)  # 2u = x(2√(2/π) + …x²)
SLOPE_2U, SIGMOID_CLIP = F(6 * GELU_SCALE * GELU_CUBIC), F(80.0)
# round 9's tanh form (GELU_FORM "tanh"): t = 1 − 2/(e^(2u) + 1), u clipped to ±9
TWO, TANH_CLIP, G_SCALE = F(2.0), F(9.0), F(GELU_SCALE)
U_CUBIC, SLOPE_CUBIC, HALF_SCALE = (F(GELU_SCALE * GELU_CUBIC), F(1.5 * GELU_SCALE * GELU_CUBIC),
                                    F(0.5 * GELU_SCALE))  # (2u)′ = 2√(2/π) + 6√(2/π)·0.044715x²


@intrinsic
def _as_float32(typingctx, bits):
    """The float32 whose bits are the int32 `bits` (LLVM's bitcast: one instruction)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@intrinsic
def _bits(typingctx, x):
    """The int32 whose bits are the float32 `x` (LLVM's bitcast: one instruction)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


MAGNITUDE = np.int32(0x7FFFFFFF)
LEAST, SIGN_SHIFT = np.int32(-(2 ** 31)), np.int32(31)


@numba.njit(inline="always", **JIT)
def _row_max(row, n):
    """max(row[:n]) for n ≥ 1 float32s (−∞ allowed; a NaN wins), by their bits: with a negative
    float's magnitude bits flipped, float order is int32 order, and LLVM vectorizes an integer
    max where it leaves a float one scalar (without "nnan", which the −∞ of a mask rules out)."""
    top = LEAST
    for j in range(n):
        b = _bits(row[j])
        key = b ^ ((b >> SIGN_SHIFT) & MAGNITUDE)
        top = key if key > top else top
    return _as_float32(top ^ ((top >> SIGN_SHIFT) & MAGNITUDE))


@numba.njit(inline="always", **JIT)
def _exp(x):
    """e^x in float32 to ~1 ulp (Cephes' expf); 0 below e^−87.3, where float32 leaves its
    normal numbers (and for −∞); NaN for NaN, as NumPy's, so that a diverging run says so."""
    c = min(max(x, EXP_LOW), EXP_HIGH)
    n = np.floor(c * LOG2E + HALF)  # float32 (math.floor would give an int64, and float64 after)
    r = c - n * LN2_HI - n * LN2_LO
    p = ((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5
    p = p * r * r + r + ONE
    y = p * _as_float32((np.int32(n) + BIAS) << MANTISSA)
    return y if x >= EXP_LOW else (ZERO if x < EXP_LOW else x)  # NaN stays NaN: a run diverging


@numba.njit(inline="always", **JIT)
def _tanh_u(x, x2):
    """tanh(u), u = √(2/π)(x + 0.044715x³) clipped to ±9 (tanh(9) rounds to 1): 1 − 2/(e^(2u) + 1)."""
    return ONE - TWO / (_exp(TWO * min(max(x * (x2 * U_CUBIC + G_SCALE), -TANH_CLIP), TANH_CLIP)) + ONE)


@numba.njit(**JIT)
def gelu(a, out, backward):
    """out = ½a(1 + tanh(√(2/π)(a + 0.044715a³))), a and out flat float32 blocks: one pass,
    one exp and one division an element; from the last element to the first where
    `backward` (4K aliasing: numpy_fused.backward says when). Each loop written out whole:
    LLVM vectorizes neither through a helper that takes the index."""
    if backward:
        for i in range(a.size - 1, -1, -1):
            x = a[i]
            t = _tanh_u(x, x * x)
            out[i] = HALF * x * (ONE + t)
    else:
        for i in range(a.size):
            x = a[i]
            t = _tanh_u(x, x * x)
            out[i] = HALF * x * (ONE + t)


@numba.njit(**JIT)
def gelu_rule(a, g, out, backward):
    """out = g·(½(1 + t) + k(1 − t²)), t = tanh(u(a)), k = ½a·u′(a): numpy_fused.gelu_rule;
    backward as gelu's."""
    if backward:
        for i in range(a.size - 1, -1, -1):
            x = a[i]
            x2 = x * x
            t = _tanh_u(x, x2)
            k = x * (x2 * SLOPE_CUBIC + HALF_SCALE)
            out[i] = g[i] * (HALF * t + HALF + k * (ONE - t * t))
    else:
        for i in range(a.size):
            x = a[i]
            x2 = x * x
            t = _tanh_u(x, x2)
            k = x * (x2 * SLOPE_CUBIC + HALF_SCALE)
            out[i] = g[i] * (HALF * t + HALF + k * (ONE - t * t))


@numba.njit(inline="always", **JIT)
def _moments(x, i, c, eps):
    """Row i's mean and 1/√(var + ε), summed in column order (both LayerNorm kernels use them)."""
    mean = ZERO
    for j in range(c):
        mean += x[i, j]
    mean = mean / F(c)
    var = ZERO
    for j in range(c):
        d = x[i, j] - mean
        var += d * d
    return mean, ONE / math.sqrt(var / F(c) + eps)


@numba.njit(**JIT)
def layer_norm(x, w, b, eps, out):
    """out = x̂·w + b for rows (N, C): x̂ = (x − mean)/√(var + ε), as numpy_fused._normalize."""
    n, c = x.shape
    for i in range(n):
        mean, scale = _moments(x, i, c, eps)
        for j in range(c):
            out[i, j] = (x[i, j] - mean) * scale * w[j] + b[j]


@numba.njit(**JIT)
def layer_norm_rule(x, dy, w, eps, dx):
    """dx = (1/σ)(g − mean g − x̂·mean(g·x̂)), g = dy·w, for rows (N, C); returns this block's
    (Σ dy·x̂, Σ dy) over its rows, in row order (numpy_fused.layer_norm_rule adds the blocks')."""
    n, c = x.shape
    dw, db = np.zeros(c, F), np.zeros(c, F)
    xhat = np.empty(c, F)
    for i in range(n):
        mean, scale = _moments(x, i, c, eps)
        g_mean, gx_mean = ZERO, ZERO
        for j in range(c):
            h = (x[i, j] - mean) * scale
            xhat[j] = h
            p = dy[i, j] * h
            dw[j] += p
            db[j] += dy[i, j]
            gx_mean += p * w[j]
            g_mean += dy[i, j] * w[j]
        g_mean, gx_mean = g_mean / F(c), gx_mean / F(c)
        for j in range(c):
            dx[i, j] = (dy[i, j] * w[j] - g_mean - xhat[j] * gx_mean) * scale
    return dw, db


@numba.njit(**JIT)
def cross_entropy(x, targets):
    """Σ over the block's rows of log Σ exp(z) − z[target], z = x − the row's max (float32)."""
    n, c = x.shape
    total = ZERO
    for i in range(n):
        top = _row_max(x[i], c)
        s = ZERO
        for j in range(c):
            s += _exp(x[i, j] - top)
        total += F(math.log(s)) - (x[i, targets[i]] - top)
    return total


@numba.njit(**JIT)
def cross_entropy_rule(x, targets, scale, out):
    """out = (softmax(x) − onehot(target))·scale for the block's rows."""
    n, c = x.shape
    for i in range(n):
        top = _row_max(x[i], c)
        s = ZERO
        for j in range(c):
            e = _exp(x[i, j] - top)
            out[i, j] = e
            s += e
        inv = ONE / s
        for j in range(c):
            out[i, j] = out[i, j] * inv * scale
        out[i, targets[i]] -= scale


@numba.njit(**JIT)
def _head(x, b, h, into):
    """into = x[b, h] (T, D), contiguous: the heads' split views stride over the other heads."""
    t, d = into.shape
    for i in range(t):
        for j in range(d):
            into[i, j] = x[b, h, i, j]


@numba.njit(**JIT)
def _head_t(x, b, h, into):
    """into = x[b, h]ᵀ (D, T), contiguous: rows over keys, so the loops over keys vectorize."""
    d, t = into.shape
    for i in range(t):
        for j in range(d):
            into[j, i] = x[b, h, i, j]


_ATTENTION: dict[tuple[int, int], tuple] = {}


def attention_kernels(t: int, d: int) -> tuple:
    """(forward, rule) compiled for T keys of D floats: both lengths constants, so that LLVM
    vectorizes every loop whole (with T and D read at run time, loops of a row's own length and of
    D = 16 fell to its scalar remainder: 2-4× slower). Compiled once per (T, D), ~1 s each."""
    if (t, d) not in _ATTENTION:
        _ATTENTION[t, d] = _compile_attention(t, d)
    return _ATTENTION[t, d]


def _compile_attention(t: int, d: int) -> tuple:
    jit = numba.njit(**{**JIT, "cache": False})  # closures over t and d: compiled per process

    @jit
    def forward(q, k, v, scale, causal, out, lse):
        """O = softmax(q kᵀ·scale, causal) v and lse = log Σ e^s for a block of sequences
        (b, H, T, D), each query row's own max as its shift (cpu/attention.py's forward); every
        row runs over all T keys, the masked ones at −∞ (e^−∞ = 0). Each product is a run of
        axpys along T (contiguous): the form LLVM vectorizes whole."""
        qh, kt, vh = np.empty((t, d), F), np.empty((d, t), F), np.empty((t, d), F)
        pt, ot, s, inv = np.empty((t, t), F), np.empty((d, t), F), np.empty(t, F), np.empty(t, F)
        for b in range(q.shape[0]):
            for h in range(q.shape[1]):
                _head(q, b, h, qh)
                _head_t(k, b, h, kt)
                _head(v, b, h, vh)
                for i in range(t):
                    s[:] = ZERO
                    for c in range(d):
                        qc = qh[i, c] * scale
                        for j in range(t):
                            s[j] += qc * kt[c, j]
                    if causal:
                        s[i + 1:] = MASKED
                    top = s[0]
                    for j in range(1, t):
                        top = max(top, s[j])
                    total = ZERO
                    for j in range(t):
                        e = _exp(s[j] - top)
                        pt[j, i] = e  # Pᵀ: O's product below runs along queries
                        total += e
                    inv[i] = ONE / total
                    lse[b, h, i, 0] = top + F(math.log(total))
                ot[:, :] = ZERO
                for j in range(t):
                    for c in range(d):
                        vc = vh[j, c]
                        for i in range(t):
                            ot[c, i] += vc * pt[j, i]
                for i in range(t):
                    for c in range(d):
                        out[b, h, i, c] = ot[c, i] * inv[i]

    @jit
    def rule(q, k, v, grad, out, lse, scale, causal, dq, dk, dv):
        """FlashAttention's backward for a block of sequences: P = exp(q kᵀ·scale − lse) again;
        dV = Pᵀ dO; dS = P ⊙ (dO Vᵀ − δ)·scale, δ = rowsum(dO ⊙ O); dQ = dS K; dK = dSᵀ Q, each
        product a run of axpys along T, into transposed (D, T) accumulators."""
        qh, kh, do = np.empty((t, d), F), np.empty((t, d), F), np.empty((t, d), F)
        kt, vt = np.empty((d, t), F), np.empty((d, t), F)
        pm, dsm, dst = np.empty((t, t), F), np.empty((t, t), F), np.empty((t, t), F)
        gqt, gkt, gvt = np.empty((d, t), F), np.empty((d, t), F), np.empty((d, t), F)
        for b in range(q.shape[0]):
            for h in range(q.shape[1]):
                _head(q, b, h, qh)
                _head(k, b, h, kh)
                _head(grad, b, h, do)
                _head_t(k, b, h, kt)
                _head_t(v, b, h, vt)
                for i in range(t):
                    p, ds = pm[i], dsm[i]
                    p[:] = ZERO
                    ds[:] = ZERO
                    delta = ZERO
                    for c in range(d):
                        qc, gc = qh[i, c] * scale, do[i, c]
                        delta += gc * out[b, h, i, c]
                        for j in range(t):
                            p[j] += qc * kt[c, j]
                            ds[j] += gc * vt[c, j]
                    if causal:
                        p[i + 1:] = MASKED
                    m = lse[b, h, i, 0]
                    for j in range(t):
                        pj = _exp(p[j] - m)
                        p[j] = pj
                        sj = pj * (ds[j] - delta) * scale
                        ds[j] = sj
                        dst[j, i] = sj
                gqt[:, :] = ZERO
                gkt[:, :] = ZERO
                gvt[:, :] = ZERO
                for i in range(t):
                    for c in range(d):
                        gc, qc = do[i, c], qh[i, c]
                        for j in range(t):
                            gvt[c, j] += gc * pm[i, j]
                            gkt[c, j] += qc * dsm[i, j]
                for j in range(t):
                    for c in range(d):
                        kc = kh[j, c]
                        for i in range(t):
                            gqt[c, i] += kc * dst[j, i]
                for i in range(t):
                    for c in range(d):
                        dq[b, h, i, c] = gqt[c, i]
                        dk[b, h, i, c] = gkt[c, i]
                        dv[b, h, i, c] = gvt[c, i]

    return forward, rule

ALL = {"gelu": gelu, "gelu_rule": gelu_rule, "layer_norm": layer_norm,
       "layer_norm_rule": layer_norm_rule, "cross_entropy": cross_entropy,
       "cross_entropy_rule": cross_entropy_rule, "attention_kernels": attention_kernels,
       "exp": _exp, "tanh_u": _tanh_u, "row_max": _row_max}

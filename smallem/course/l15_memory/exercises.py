"""Lesson 15, what backward must keep: the bytes of one attention layer (confirmed by the tape),
the online softmax's update (run by the lesson's tiled forward), and one tile of the backward
from the saved log-sum-exp (graded by the package's own attention gradchecks)."""

from __future__ import annotations

import numpy as np

from ...autodiff.attention import Attention
from ...autodiff.gradcheck import attention_cases
from ...autodiff.tape import Tape
from ...models.transformer import CausalSelfAttention, TransformerConfig
from ..common.graders import Wrong, call, compare, number, parts
from ..common.grading import exercise


def layer_bytes(b: int, t: int, c: int, h: int, backend: str = "cpu") -> int:
    """What the tape keeps for one unfused attention layer on a (B, T, C) input: counted."""
    layer = CausalSelfAttention(TransformerConfig(width=c, heads=h, context=t, attention="unfused"),
                                backend, np.random.default_rng(0))
    tape = Tape(backend)
    layer(tape, tape.leaf(np.zeros((b, t, c))))
    tape.close()
    return tape.memory().kept


def _update(rescale_acc: bool = True, keep_max: bool = True, rescale_sum: bool = True):
    """A planted online update: the solution with one step left out."""
    def online_update(m, total, acc, s, v):
        m_new = np.maximum(m, s.max(-1, keepdims=True)) if keep_max else s.max(-1, keepdims=True)
        anchor = np.where(np.isneginf(m_new), 0.0, m_new)
        alpha, p = np.exp(m - anchor), np.exp(s - anchor)
        return (m_new, (total * alpha if rescale_sum else total) + p.sum(-1, keepdims=True),
                (acc * alpha if rescale_acc else acc) + p @ v)
    return online_update


def _tile(scale: bool = True, delta: bool = True, mask: bool = True, sign: int = 1, own: bool = False):
    """A planted tile backward: the solution with one term left out (or δ turned round, `sign`=-1,
    or recomputed from this tile alone, `own`)."""
    def tile_backward(q, k, v, do, lse, d, c, m):
        s = q @ np.swapaxes(k, -1, -2) * c + (0.0 if m is None or not mask else m)
        p = np.exp(s - lse)
        dp = do @ np.swapaxes(v, -1, -2)
        d = (p * dp).sum(-1, keepdims=True) if own else d
        ds = p * (dp - (d if delta else 0.0)) * sign
        f = c if scale else 1.0
        return ds @ k * f, np.swapaxes(ds, -1, -2) @ q * f, np.swapaxes(p, -1, -2) @ do
    return tile_backward


# -- 15.attention_bytes ------------------------------------------------------------------------

@exercise("15.attention_bytes", title="the bytes one attention layer keeps for backward",
          hints=("Walk the layer's forward and count each tensor the tape keeps: three Linears "
                 "(a matmul and a bias add each), q kᵀ, the scaled scores, the weights, their "
                 "product with v, the merge of the heads, the output Linear. The splits are "
                 "views: 0 bytes.",
                 "Ten tensors are (B, T, C): q, k, v before and after their biases, the mixed "
                 "heads, their merge, the output before and after its bias. Three are "
                 "(B, H, T, T): q kᵀ, the scaled scores, the softmax weights.",
                 "itemsize * (10 * B * T * C + 3 * B * H * T * T)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "one (T, T) matrix": (lambda b, t, c, h, i=4: i * (10 * b * t * c + b * h * t * t),
                                    "only one (B, H, T, T)"),
              "heads forgotten": (lambda b, t, c, h, i=4: i * (10 * b * t * c + 3 * b * t * t),
                                  "once per head"),
              "numbers, not bytes": (lambda b, t, c, h, i=4: 10 * b * t * c + 3 * b * h * t * t,
                                     "not bytes"),
              "views counted": (lambda b, t, c, h, i=4: i * (16 * b * t * c + 3 * b * h * t * t),
                                "views"),
              "no (T, T)": (lambda b, t, c, h, i=4: i * 10 * b * t * c, "matrices are missing"),
              "something else": (lambda b, t, c, h, i=4: 7, "where the tape keeps"),
              "two (T, T) matrices": (lambda b, t, c, h, i=4: i * (10 * b * t * c + 2 * b * h * t * t),
                                      "only two (B, H, T, T)"),
              "a (B, T, C) tensor missing": (lambda b, t, c, h, i=4: i * (9 * b * t * c + 3 * b * h * t * t),
                                             "one (B, T, C) tensor is missing"),
              "the input counted": (lambda b, t, c, h, i=4: i * (11 * b * t * c + 3 * b * h * t * t),
                                    "the input x is counted"),
              "the causal half": (lambda b, t, c, h, i=4: i * (10 * b * t * c + 3 * b * h * t * (t + 1) // 2),
                                  "causal half"),
              "D for C": (lambda b, t, c, h, i=4: i * (10 * b * t * (c // h) + 3 * b * h * t * t),
                          "as (B, T, D)"),
              "float64 by default": (lambda b, t, c, h, i=8: i * (10 * b * t * c + 3 * b * h * t * t),
                                     "itemsize=4"),
          },
          hint_for={'itemsize': 3, 'not bytes': 3, 'views': 1, '(B, H, T, T)': 2, '(T, T)': 2,
                    '(B, T, C)': 2, '(B, T, D)': 2},
          answer="attention_bytes", alternate_cell='''
# Exercise 15.attention_bytes · what one unfused attention layer keeps, in bytes
import math

def attention_bytes(B, T, C, H, itemsize=4):
    kept = [(B, T, C)] * 10 + [(B, H, T, T)] * 3    # ten activations, three score-sized matrices
    return itemsize * sum(math.prod(shape) for shape in kept)
''', solution_cell='''
# Exercise 15.attention_bytes · what one unfused attention layer keeps, in bytes
def attention_bytes(B, T, C, H, itemsize=4):
    """Bytes the tape keeps for one CausalSelfAttention on a (B, T, C) input, H heads."""
    return itemsize * (10 * B * T * C + 3 * B * H * T * T)   # 10 (B,T,C) + 3 (B,H,T,T)
''')
def attention_bytes(answer):
    # B·T·C ≠ B·H·T·T in each shape, so a missing (B, T, C) tensor and a missing (B, H, T, T) one differ
    for k, (b, t, c, h) in enumerate(((2, 8, 12, 2), (1, 32, 8, 4), (3, 5, 12, 3))):
        on = f"B={b}, T={t}, C={c}, H={h}, float32"
        want = layer_bytes(b, t, c, h)
        if k == 0:  # the notebook calls it without an itemsize: float32, 4 bytes, by default
            got = number(call(answer, b, t, c, h, on=f"{on}, itemsize left out"), "attention_bytes(...)")
            if got != want and number(call(answer, b, t, c, h, 4, on=on), "attention_bytes(...)") == want:
                raise Wrong(f"attention_bytes({b}, {t}, {c}, {h}) without an itemsize gives {got:,.0f} where "
                            f"the tape keeps {want:,} bytes: the lesson's layers are float32, so the default "
                            "is itemsize=4 (the notebook calls it without one).")
        got = number(call(answer, b, t, c, h, 4, on=on), "attention_bytes(...)")
        if got == want:
            continue
        linear, square, d = 4 * b * t * c, 4 * b * h * t * t, c // h
        for guess, why in (
                (want - square, "only two (B, H, T, T) tensors are counted: the tape keeps three, q kᵀ, "
                 "the scaled scores and the softmax weights"),
                (want - 2 * square, "only one (B, H, T, T) tensor is counted: the tape also keeps q kᵀ "
                 "and the scaled scores, three in all"),
                (want - 3 * square + 3 * 4 * b * t * t, "the (T, T) matrices are counted once, not once "
                 "per head: each of the H heads has its own"),
                (want / 4, "the count is in numbers, not bytes: float32 is 4 bytes"),
                (want - 3 * square, "the (B, H, T, T) matrices are missing"),
                (want - linear, "one (B, T, C) tensor is missing: the tape keeps ten, q, k and v before and "
                 "after their biases, the mixed heads, their merge, the output before and after its bias"),
                (want + linear, "the input x is counted too: it is the layer before's output, and this "
                 "layer keeps the ten (B, T, C) tensors it makes"),
                (want - 3 * square + 3 * 2 * b * h * t * (t + 1), "only the causal half of each (T, T) "
                 "matrix is counted: the masked entries are stored as well, a full (T, T) array per head"),
                (want - 10 * linear + 10 * 4 * b * t * d, "the (B, T, C) tensors are counted as (B, T, D): "
                 "the heads side by side span all C = H·D columns"),
                (want + 6 * linear, "the splits into heads are counted: a reshape and a transpose are "
                 "views of the same bytes, the tape holds nothing new")):
            if np.isclose(got, guess):
                raise Wrong(f"{why} ({on}: the tape keeps {want:,} bytes, you say {got:,.0f}).")
        raise Wrong(f"attention_bytes gives {got:,.0f} where the tape keeps {want:,} bytes "
                    f"({on}).")
    return "the tape's own count, for three shapes, float32 by default"


# -- 15.online_update --------------------------------------------------------------------------

def _reference_update(m, total, acc, s, v):
    m_new = np.maximum(m, s.max(-1, keepdims=True))
    anchor = np.where(np.isneginf(m_new), 0.0, m_new)  # a row still at −∞: exp(−∞ − (−∞)) would be nan
    alpha, p = np.exp(m - anchor), np.exp(s - anchor)
    return m_new, total * alpha + p.sum(-1, keepdims=True), acc * alpha + p @ v


@exercise("15.online_update", title="the online softmax: one key tile into a running max and sum",
          hints=("The new running max is the larger of the old one and this tile's row max. "
                 "Everything summed so far was exp(s − old max): to put it on the new max, "
                 "multiply by exp(old max − new max).",
                 "alpha = exp(m − m_new); p = exp(s − m_new); l_new = l·alpha + Σ p; "
                 "acc_new = acc·alpha + p @ v.",
                 "m_new = np.maximum(m, s.max(axis=-1, keepdims=True)), then the two lines of "
                 "hint 2, on an anchor that is 0 where m_new is still −∞ (a row masked so far): "
                 "exp(−∞ − (−∞)) is nan, exp(−∞ − 0) is the 0 it should be."),
          mistakes={
              "acc not rescaled": (_update(rescale_acc=False), "acc is not rescaled"),
              "the old max forgotten": (_update(keep_max=False), "forgets the old one"),
              "the sum not rescaled": (_update(rescale_sum=False), "l_new"),
              "two values": (lambda m, total, acc, s, v: (m, total), "returns three arrays"),
          },
          hint_for={"−∞": 3, "forgets the old one": 1, "acc is not rescaled": 2, "l_new": 2},
          answer="online_update", alternate_cell='''
# Exercise 15.online_update · fold one tile of scores s (.., Tq, Tk) and values v (.., Tk, D) in
def online_update(m, total, acc, s, v):
    tile_max = np.max(s, axis=-1, keepdims=True)
    new_max = np.where(tile_max > m, tile_max, m)
    shift = np.where(new_max == -np.inf, 0.0, new_max)   # every score so far masked: nothing to rescale
    rescale = np.exp(m - shift)                      # 1 where the max did not move
    weights = np.exp(s - shift)
    new_total = rescale * total + np.sum(weights, axis=-1, keepdims=True)
    new_acc = rescale * acc + np.einsum("...qk,...kd->...qd", weights, v)
    return [new_max, new_total, new_acc]
''', solution_cell='''
# Exercise 15.online_update · fold one tile of scores s (.., Tq, Tk) and values v (.., Tk, D) in
def online_update(m, total, acc, s, v):
    """m, total (.., Tq, 1): running max and sum l; acc (.., Tq, D): Σ exp(s − m) v so far."""
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))   # −∞ (masked) never wins
    anchor = np.where(np.isneginf(m_new), 0.0, m_new)      # a row masked so far: −∞ − (−∞) is nan
    alpha = np.exp(m - anchor)                              # rescale what was summed on the old max
    p = np.exp(s - anchor)
    return m_new, total * alpha + p.sum(axis=-1, keepdims=True), acc * alpha + p @ v
''')
def online_update(answer):
    rng = np.random.default_rng(15)
    s = rng.normal(size=(2, 4, 3)) * 3
    s[0, 1] = -np.inf  # a row this tile masks whole: it must change nothing
    s[1, 2, 1:] = -np.inf
    m = rng.normal(size=(2, 4, 1))
    total, acc, v = rng.uniform(1, 3, size=(2, 4, 1)), rng.normal(size=(2, 4, 5)), rng.normal(size=(2, 3, 5))
    on = "a tile of scores (2, 4, 3) with masked entries, values (2, 3, 5)"
    got = call(answer, m.copy(), total.copy(), acc.copy(), s.copy(), v.copy(), on=on)
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise Wrong("online_update returns three arrays: (m_new, l_new, acc_new).")
    low = next((a.dtype for a in got if getattr(a, "dtype", None) in (np.float32, np.float16)), None)
    if low is not None:
        raise Wrong(f"your update returns {low} ({on}): the lesson's tiled forward is compared with "
                    "softmax(q kᵀ/√D) v to float64 rounding (1e-12), so keep m, l, acc, s and v as "
                    "they come, without converting them.")
    # a row whose running max is still −∞ (every score so far masked) meets a tile masked whole too
    still = (np.array([[-np.inf], [0.5]]), np.array([[0.0], [2.0]]), np.array([[0.0, 0.0], [1.0, -1.0]]),
             np.array([[-np.inf, -np.inf], [0.3, -0.2]]), np.array([[1.0, 2.0], [3.0, 4.0]]))
    row = call(answer, *(a.copy() for a in still), on="a row still at −∞ and a tile masked whole")
    if isinstance(row, (tuple, list)) and len(row) == 3 and not all(
            np.all(np.isfinite(np.asarray(a, float)[1:])) and np.all(np.isfinite(np.asarray(a, float)[0]))
            for a in row[1:]):
        raise Wrong("a row whose running max is still −∞ (every score so far masked) and whose tile is "
                    "masked whole gives nan: exp(−∞ − (−∞)) is nan; take the exponents from an anchor that "
                    "is 0 where m_new is −∞, so that row keeps l = 0 and acc = 0.")
    if isinstance(row, (tuple, list)) and len(row) == 3:
        right = _reference_update(*still)
        if np.array_equal(np.asarray(row[0], float), still[3].max(-1, keepdims=True)):
            raise Wrong("the new max forgets the old one: m_new = max(m, this tile's max) (a running max "
                        "of 0.5 meets a tile whose scores are 0.3 and −0.2).")
        if not np.array_equal(np.asarray(row[0], float), right[0]):
            raise Wrong(f"m_new is {np.asarray(row[0], float).ravel().tolist()} where it should be "
                        f"{right[0].ravel().tolist()} (a row still at −∞ and a tile masked whole): a row "
                        "masked so far keeps its −∞ until a score arrives.")
        for name, a, w in zip(("l_new", "acc_new"), row[1:], right[1:]):
            compare(name, a, w, on="a row still at −∞ and a tile masked whole",
                    source="the online softmax gives")
    want = _reference_update(m, total, acc, s, v)
    if np.allclose(np.asarray(got[2], float), acc + np.exp(s - want[0]) @ v):
        raise Wrong(f"acc is not rescaled: what was summed so far is on the old max, multiply it "
                    f"by exp(m − m_new) before adding this tile ({on}).")
    if np.allclose(np.asarray(got[0], float), s.max(-1, keepdims=True)):
        raise Wrong(f"the new max forgets the old one: m_new = max(m, this tile's max) ({on}).")
    for name, a, w in zip(("m_new", "l_new", "acc_new"), got, want):
        compare(name, a, w, on=on, source="the online softmax gives")
    # the whole tiled forward, with this update, is softmax(q kᵀ/√D, causal) v
    q, k, vv = (rng.normal(size=(1, 2, 11, 4)) for _ in range(3))
    tape = Tape("cpu64")
    out = tape.apply(Attention(tile=4, update=lambda be, *a: answer(*a)),
                     [tape.constant(x) for x in (q, k, vv)])
    scores = q @ k.swapaxes(-1, -2) / 2 + np.triu(np.full((11, 11), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    compare("the tiled forward with your update", out.value, (p / p.sum(-1, keepdims=True)) @ vv,
            on="T = 11 in tiles of 4, causal", source="softmax(q kᵀ/√D) v gives")
    return "and the tiled forward it drives gives softmax(q kᵀ/√D) v, T = 11 in tiles of 4"


def _named_tile_mistakes(answer, rng) -> None:
    """A tile of 3 queries and 4 keys, half masked: a common mistake is named before the gradchecks."""
    q, do, lse, delta = rng.normal(size=(1, 3, 2)), rng.normal(size=(1, 3, 2)), *rng.normal(size=(2, 1, 3, 1))
    k, v = rng.normal(size=(1, 4, 2)), rng.normal(size=(1, 4, 2))
    mask = np.triu(np.full((3, 4), -np.inf), 2)
    args = (q, k, v, do, lse, delta, 0.7, mask)
    on = "a tile of 3 queries and 4 keys, causal mask"
    got = [np.asarray(a, float) for a in parts(call(answer, *(a.copy() if isinstance(a, np.ndarray) else a
                                                                for a in args), on=on), 3,
                                                 "tile_backward returns three arrays, (dq, dk, dv)")]
    want = _tile()(*args)

    def same(a, b):
        return len(a) == len(b) and all(x.shape == y.shape and np.allclose(x, y) for x, y in zip(a, b))

    if same(got, want):
        return
    if sorted(map(str, map(np.shape, got))) == sorted(map(str, map(np.shape, want))) and any(
            same(got, [want[i] for i in order])
            for order in ((0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))):
        raise Wrong(f"the three gradients come back in another order ({on}): return (dq, dk, dv), "
                    "the order of the inputs q, k, v.")
    for wrong, why in ((_tile(delta=False), "δ is missing: dS = P ⊙ (dP − δ), where δ = rowsum(dO ⊙ O) "
                        "takes off what every weight's change does to the row's normalisation"),
                       (_tile(sign=-1), "δ − dP is turned round: dS = P ⊙ (dP − δ)"),
                       (_tile(own=True), "δ is recomputed from this tile alone: δ = rowsum(dO ⊙ O) runs "
                        "over the whole row of keys, which is why it is handed in; use the `delta` given"),
                       (_tile(scale=False), "the scale is missing from dQ and dK: the scores were "
                        "q kᵀ·scale, so both carry the factor")):
        if same(got, wrong(*args)):
            raise Wrong(f"{why} ({on}).")


# -- 15.tile_backward --------------------------------------------------------------------------

@exercise("15.tile_backward", title="one tile of the backward, from the saved log-sum-exp",
          hints=("First the tile's weights again, without any softmax: P = exp(q kᵀ·scale + mask − "
                 "lse). The mask is None on tiles with nothing to mask.",
                 "dV = Pᵀ dO; dP = dO Vᵀ; dS = P ⊙ (dP − δ), δ being rowsum(dO ⊙ O), given.",
                 "dQ = dS K·scale and dK = dSᵀ Q·scale: the scores were q kᵀ·scale."),
          mistakes={
              "no scale": (_tile(scale=False), "the scale is missing"),
              "no delta": (_tile(delta=False), "δ is missing"),
              "δ turned round": (_tile(sign=-1), "turned round"),
              "δ from the tile": (_tile(own=True), "recomputed from this tile"),
              "dk and dv swapped": (lambda *a: (lambda g: (g[0], g[2], g[1]))(_tile()(*a)), "another order"),
              "mask ignored": (_tile(mask=False), "the mask is added"),
              "inputs handed back": (lambda q, k, v, do, lse, d, c, m: (q, k, v),
                                     "finite differences disagree"),
          },
          hint_for={"mask": 1, "δ": 2, "scale is missing": 3, "another order": 3},
          answer="tile_backward", alternate_cell='''
# Exercise 15.tile_backward · one (query tile, key tile): its share of dQ, dK, dV
def tile_backward(q, k, v, do, lse, delta, scale, mask):
    scores = np.einsum("...id,...jd->...ij", q, k) * scale
    if mask is not None:
        scores = scores + mask
    p = np.exp(scores - lse)
    ds = p * (np.einsum("...id,...jd->...ij", do, v) - delta) * scale   # the scale, once for dq and dk
    dq = np.einsum("...ij,...jd->...id", ds, k)
    dk = np.einsum("...ij,...id->...jd", ds, q)
    dv = np.einsum("...ij,...id->...jd", p, do)
    return dq, dk, dv
''', solution_cell='''
# Exercise 15.tile_backward · one (query tile, key tile): its share of dQ, dK, dV
def tile_backward(q, k, v, do, lse, delta, scale, mask):
    """q, do (.., Tq, D); k, v (.., Tk, D); lse, delta (.., Tq, 1); mask (Tq, Tk) of 0/−∞, or None."""
    s = q @ np.swapaxes(k, -1, -2) * scale + (0.0 if mask is None else mask)
    p = np.exp(s - lse)                        # the weights again, from the saved log-sum-exp
    dv = np.swapaxes(p, -1, -2) @ do
    ds = p * (do @ np.swapaxes(v, -1, -2) - delta)
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
''')
def tile_backward(answer):
    rng = np.random.default_rng(16)  # one tile first: a stub or a missing return is told so
    tile = [rng.normal(size=(1, 3, 2)) for _ in range(4)] + [rng.normal(size=(1, 3, 1))] * 2
    parts(call(answer, *tile, 0.7, None, on="one tile (1, 3, 2), no mask"), 3,
          "tile_backward returns three arrays, (dq, dk, dv)")
    _named_tile_mistakes(answer, rng)

    def planted(be, q, k, v, do, lse, delta, scale, mask):
        return answer(q, k, v, do, lse, delta, scale, mask)

    for case in attention_cases(backward_tile=planted):
        result = case.run()
        if result.error:
            raise Wrong(f"your tile_backward could not run on '{case.name}': {result.error}")
        if not result.passed:
            names = ("dq", "dk", "dv")
            worst = max(range(3), key=lambda i: float(np.max(np.abs(
                result.analytic[i] - result.numeric[i]), initial=0.0)))
            hint = ""
            if "causal" in case.name and all(r.passed for r in (
                    c.run() for c in attention_cases(planted) if "full" in c.name)):
                hint = ": right without a mask, wrong with one; check that the mask is added to the scores"
            raise Wrong(f"finite differences disagree on '{case.name}', worst in {names[worst]} "
                        f"(max error {result.max_error:.2g}){hint}.")
    return "passes the package's own attention gradchecks, causal masks of every shape"

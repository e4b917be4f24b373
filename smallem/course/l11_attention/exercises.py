"""Lesson 11, attention: softmax's rule, the causal mask, one head on the tape, and the head
split and merge of multi-head attention, each graded against NumPy references and finite
differences (float64)."""

from __future__ import annotations

import math

import numpy as np

from ...autodiff.gradcheck import check_gradients
from ...autodiff.operations import softmax
from ...autodiff.tape import Tape, Var
from ..common.graders import Wrong, call, compare
from ..common.grading import exercise
from ..common.references import as_boolean_mask, head_reference, softmax_rows

# -- 11.softmax_backward -----------------------------------------------------------------------

def _softmax_on_tape(tape: Tape, x: Var) -> Var:
    """Softmax from five primitives (the row max enters as a constant: shifting is free)."""
    m = tape.constant(np.max(tape.backend.to_numpy(x.value), axis=-1, keepdims=True))
    e = tape.exp(x - m)
    return e / tape.sum(e, -1, keepdim=True)


@exercise("11.softmax_backward", title="softmax's rule: ds → dx = s ⊙ (g − Σⱼ gⱼsⱼ)",
          hints=("Raising one xᵢ raises sᵢ and lowers every other sⱼ, since a row sums to 1: the "
                 "gradient of xᵢ collects g through every sⱼ, not only through sᵢ.",
                 "The Jacobian is ∂sⱼ/∂xᵢ = sⱼ(δᵢⱼ − sᵢ); multiply by g and sum over j: "
                 "dxᵢ = sᵢ(gᵢ − Σⱼ gⱼsⱼ).",
                 "In NumPy, one dot product per row: s * (g - (g * s).sum(axis=-1, keepdims=True))."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "the diagonal only": (lambda s, g: g * s * (1 - s), "only the diagonal of the Jacobian"),
              "no sum term": (lambda s, g: g * s, "leaves out the sum"),
              "sum over the wrong axis": (lambda s, g: s * (g - (g * s).sum(axis=0, keepdims=True)),
                                          "where finite differences give"),
              "sign of the sum": (lambda s, g: s * (g + (g * s).sum(axis=-1, keepdims=True)),
                                  "where finite differences give"),
              "no keepdims": (lambda s, g: s * (g - (g * s).sum(axis=-1)), "raised ValueError"),
              "float32": (lambda s, g: np.float32(s) * (np.float32(g) - np.sum(
                  np.float32(g) * np.float32(s), axis=-1, keepdims=True)), "returns float32"),
          },
          answer="softmax_backward", alternate_cell='''
# Exercise 11.softmax_backward · s = softmax(x) over the last axis, g = d loss / d s: d loss / d x
def softmax_backward(s, g):
    per_row = np.einsum("...t,...t->...", g, s)     # Σⱼ gⱼ sⱼ, one number per row
    return s * g - s * per_row[..., np.newaxis]
''', solution_cell='''
# Exercise 11.softmax_backward · s = softmax(x) over the last axis, g = d loss / d s: d loss / d x
def softmax_backward(s, g):
    """s, g (..., T). Return dx (..., T) = s ⊙ (g − Σⱼ gⱼ sⱼ), the sum over each row."""
    return s * (g - (g * s).sum(axis=-1, keepdims=True))   # keepdims: one number per row
''')
def softmax_backward(answer):
    rng = np.random.default_rng(11)
    cases = [("x random (3, 5)", rng.normal(size=(3, 5)) * 2, None),
             ("x random (2, 3, 4)", rng.normal(size=(2, 3, 4)), None),
             ("a causal (4, 4): zeros above the diagonal", rng.normal(size=(4, 4)),
              np.tril(np.ones((4, 4), bool)))]
    for on, x, allowed in cases:
        g = rng.normal(size=x.shape)
        s = softmax_rows(x, allowed)
        if allowed is None:
            want = check_gradients(_softmax_on_tape, [x], weights=g).numeric[0]
            source = "finite differences give"
        else:  # the masked entries are constants: the rule must give them exactly 0
            want, source = s * (g - (g * s).sum(-1, keepdims=True)), "the rule gives"
        got = call(answer, s.copy(), g.copy(), on=on)
        if getattr(got, "dtype", None) in (np.float32, np.float16):
            raise Wrong(f"your rule returns {got.dtype} ({on}): the lesson's tape and the capstone "
                        "compute in float64 and compare to float64 rounding (1e-12), so keep s and g "
                        "as they come, without converting them.")
        if np.shape(got) == s.shape and np.allclose(got, g * s * (1 - s)) and not np.allclose(got, want):
            raise Wrong(f"this is only the diagonal of the Jacobian, gᵢsᵢ(1 − sᵢ) ({on}): every sⱼ "
                        "also moves when xᵢ changes (by −sᵢsⱼ), and those moves are the Σⱼ gⱼsⱼ term.")
        if np.shape(got) == s.shape and np.allclose(got, g * s) and not np.allclose(got, want):
            raise Wrong(f"g ⊙ s leaves out the sum ({on}): raising one xᵢ lowers every other sⱼ, "
                        "since the row must still sum to 1.")
        compare("dx", got, want, on=on, source=source, tolerance=1e-6)
        if allowed is not None and np.any(np.asarray(got)[~np.broadcast_to(allowed, s.shape)] != 0):
            raise Wrong(f"a masked entry (s = 0) got a gradient that is not exactly 0 ({on}).")
    return "matches finite differences, batched rows and masked zeros included"


# -- 11.causal_mask ----------------------------------------------------------------------------

@exercise("11.causal_mask", title="the causal mask: position i may look at 0, …, i",
          hints=("Row i is the position that predicts; column j is a byte it might read. Which j "
                 "are in the past of i, or i itself?",
                 "mask[i, j] is True exactly when j ≤ i: the lower triangle, diagonal included.",
                 "One line does it: np.tril(np.ones((T, T), dtype=bool))."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "leaky (k=1)": (lambda t: np.tril(np.ones((t, t), bool), k=1), "the leaky mask"),
              "upside down": (lambda t: np.triu(np.ones((t, t), bool)), "upside down"),
              "no diagonal": (lambda t: np.tril(np.ones((t, t), bool), k=-1), "row 0 allows nothing"),
              "nothing masked": (lambda t: np.ones((t, t), bool), "every entry is allowed"),
              "an additive mask": (lambda t: np.where(np.tril(np.ones((t, t))), 0.0, -np.inf), "True/False"),
              "a vector": (lambda t: np.ones(t, bool), "should be [4, 4]"),
          },
          answer="causal_mask", hand_on=as_boolean_mask, alternate_cell='''
# Exercise 11.causal_mask · which bytes may position i look at?
def causal_mask(T):
    return [[j <= i for j in range(T)] for i in range(T)]   # lists of True/False, row by row
''', solution_cell='''
# Exercise 11.causal_mask · which bytes may position i look at?
def causal_mask(T):
    """A (T, T) boolean array: mask[i, j] is True when position i may look at position j."""
    return np.tril(np.ones((T, T), dtype=bool))   # j ≤ i: the past and itself, never the future
''')
def causal_mask(answer):
    for t in (4, 7, 1):
        got = call(answer, t, on=f"T = {t}")
        want = np.tril(np.ones((t, t), bool))
        a = np.asarray(got)
        if a.shape != want.shape:
            raise Wrong(f"causal_mask({t}) has shape {list(a.shape)} where it should be [{t}, {t}].")
        if a.dtype != bool and not np.isin(a, (0, 1)).all():
            raise Wrong(f"causal_mask({t}) holds {a.ravel()[~np.isin(a.ravel(), (0, 1))][0]!r}: it "
                        "says yes or no for each pair, True/False (or 1/0); the −∞ comes when "
                        "it is applied.")
        a = a.astype(bool)
        if np.array_equal(a, want):
            continue
        if np.array_equal(a, np.tril(np.ones((t, t), bool), k=1)):
            raise Wrong(f"position i may also read byte i + 1, the very byte it must predict "
                        f"(T = {t}): this is the leaky mask, np.tril(..., k=1), that training "
                        "loves and held-out text punishes.")
        if np.array_equal(a, np.triu(np.ones((t, t), bool))):
            raise Wrong(f"row 0 may look at every later byte (T = {t}): the mask is upside down, "
                        "np.triu lets each position read the future where np.tril keeps the past.")
        if np.array_equal(a, np.tril(np.ones((t, t), bool), k=-1)):
            raise Wrong(f"row 0 allows nothing (T = {t}): a position must see its own byte, and a "
                        "row with every entry masked makes softmax compute 0/0.")
        if a.all():
            raise Wrong(f"every entry is allowed (T = {t}): nothing stops position 0 from reading "
                        "the last byte.")
        i, j = (int(k) for k in np.argwhere(a != want)[0])
        raise Wrong(f"mask[{i}, {j}] is {bool(a[i, j])} where it should be {bool(want[i, j])} "
                    f"(T = {t}): position {i} may look at {j} exactly when {j} ≤ {i}.")
    return "position i sees 0, …, i, itself included, for T = 4, 7 and 1"


# -- 11.one_head -------------------------------------------------------------------------------

def _head(scale, causal=True, detach=False, swap=False):
    """A planted one-head answer: built like the solution, with one change."""
    def one_head(tape, x, wq, wk, wv):
        q, k, v = x @ wq, x @ wk, x @ wv
        scores = (k @ tape.transpose(q) if swap else q @ tape.transpose(k)) / scale(wq.shape[1])
        weights = softmax(tape, scores, causal=causal)
        if detach:
            weights = tape.constant(weights.value)  # computed, then cut off from the tape
        return weights @ v
    return one_head

def _head_masked(how: str):
    """A planted one-head answer whose mask is wrong in one of the common ways, on the tape."""
    def one_head(tape, x, wq, wk, wv):
        q, k, v = x @ wq, x @ wk, x @ wv
        scores = q @ tape.transpose(k) / math.sqrt(wq.shape[1])
        tril = np.tril(np.ones((scores.shape[-1],) * 2))
        if how == "after":
            weights = softmax(tape, scores) * tape.constant(tril)
        elif how == "zero":
            weights = softmax(tape, scores * tape.constant(tril))
        elif how == "leaky":
            weights = softmax(tape, scores + tape.constant(np.where(np.tril(tril + 1, 1), 0.0, -1e9)))
        else:
            weights = tape.transpose(softmax(tape, tape.transpose(scores)
                                             + tape.constant(np.where(tril.T, 0.0, -1e9))))
        return weights @ v
    return one_head


def _masking_mistakes(scores: np.ndarray, tril: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """The attention weights of the common ways to get the mask wrong, with what each did."""
    masked = np.where(tril, scores, -np.inf)
    columns = np.exp(masked - masked.max(axis=0, keepdims=True))
    return [(softmax_rows(scores) * tril,
             "the mask is applied after the softmax: each row's weights no longer sum to 1, and the "
             "future still took its share before it was cut; mask the scores with −∞ first"),
            (softmax_rows(np.where(tril, scores, 0.0)),
             "the masked scores are set to 0 instead of −∞: exp(0) = 1, so the future still gets "
             "weight; softmax(tape, scores, causal=True) puts exactly 0 there"),
            (softmax_rows(scores, np.tril(np.ones_like(tril), k=1)),
             "position i also sees i + 1, the byte it must predict: the mask is one diagonal too "
             "wide (j ≤ i, not j ≤ i + 1)"),
            (columns / columns.sum(axis=0, keepdims=True),
             "the softmax runs over the wrong axis: each column sums to 1 where each row should "
             "(row i's weights over the positions j it reads)")]


@exercise("11.one_head", title="one causal head on the tape: softmax(q·kᵀ/√D, causal) · v",
          hints=("Three products of x make the queries, keys and values: q, k, v = x @ wq, x @ wk, "
                 "x @ wv, each (T, D). Stay on the tape: use the Vars' operators, never .value.",
                 "Row i of the scores holds qᵢ·kⱼ for every j: q @ tape.transpose(k), divided by "
                 "math.sqrt(D) with D = wq.shape[1].",
                 "weights = softmax(tape, scores, causal=True), then return weights @ v."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "no 1/sqrt(D)": (_head(lambda d: 1.0), "not divided by √D = 2"),
              "1/D": (_head(lambda d: d), "divided by D = 4"),
              "no mask": (_head(math.sqrt, causal=False), "no causal mask"),
              "q and k swapped": (_head(math.sqrt, swap=True), "the scores are k qᵀ"),
              "weights detached": (_head(math.sqrt, detach=True), "computed outside the tape"),
              "a NumPy array": (lambda tape, x, wq, wk, wv: np.zeros((5, 4)),
                                "a NumPy array has no gradient"),
              "mask after the softmax": (_head_masked("after"), "after the softmax"),
              "0 instead of −∞": (_head_masked("zero"), "0 instead of −∞"),
              "i sees i + 1": (_head_masked("leaky"), "sees i + 1"),
              "softmax over the wrong axis": (_head_masked("columns"), "wrong axis"),
          },
          answer="one_head", env={"softmax": softmax}, alternate_cell='''
# Exercise 11.one_head · x (T, C) → (T, D): every position a weighted average of the values
def one_head(tape, x, wq, wk, wv):
    T, D = x.shape[0], wq.shape[1]
    q = (x @ wq) / math.sqrt(D)                          # scale the queries, not the scores
    blocked = np.triu(np.full((T, T), -1e9), k=1)        # the future: exp(-1e9) is exactly 0
    weights = softmax(tape, q @ tape.transpose(x @ wk) + tape.constant(blocked))
    return weights @ (x @ wv)
''', solution_cell='''
# Exercise 11.one_head · x (T, C) → (T, D): every position a weighted average of the values
def one_head(tape, x, wq, wk, wv):
    """x (T, C), wq, wk, wv (C, D), all Vars. Return softmax(q kᵀ / √D, causal) v, shape (T, D)."""
    q, k, v = x @ wq, x @ wk, x @ wv                         # (T, D) each
    scores = q @ tape.transpose(k) / math.sqrt(wq.shape[1])  # (T, T): row i scores every j
    weights = softmax(tape, scores, causal=True)             # j > i gets exactly 0
    return weights @ v                                       # (T, D)
''')
def one_head(answer):
    rng = np.random.default_rng(111)
    x, wq, wk, wv = (rng.normal(size=s) for s in [(5, 6), (6, 4), (6, 4), (6, 4)])
    on = "x (5, 6) and wq, wk, wv (6, 4) random"
    tape = Tape("cpu64")
    leaves = [tape.leaf(a) for a in (x, wq, wk, wv)]
    got = call(answer, tape, *leaves, on=on)
    if not isinstance(got, Var):
        raise Wrong(f"one_head returns the tape's Var (built with the tape's operations), got "
                    f"{type(got).__name__}: a NumPy array has no gradient.")
    value = np.asarray(got.value)
    want = head_reference(x, wq, wk, wv)
    if value.shape == want.shape and not np.allclose(value, want):
        for variant, why in [(dict(scale=False), "the scores are not divided by √D = 2"),
                             (dict(causal=False), "no causal mask: position 0 averages all five values"),
                             (dict(swap=True), "the scores are k qᵀ, not q kᵀ: row i must hold "
                                               "qᵢ·kⱼ, the query of position i against the key of each j")]:
            if np.allclose(value, head_reference(x, wq, wk, wv, **variant)):
                raise Wrong(f"{why} ({on}).")
        q, k, v = x @ wq, x @ wk, x @ wv
        tril = np.tril(np.ones((5, 5), bool))
        if np.allclose(value, softmax_rows(q @ k.T / 4, tril) @ v):
            raise Wrong(f"the scores are divided by D = 4, not √D = 2 ({on}).")
        for weights, why in _masking_mistakes(q @ k.T / 2, tril):
            if np.allclose(value, weights @ v):
                raise Wrong(f"{why} ({on}).")
    compare("one_head(...)", value, want, on=on, source="softmax(q kᵀ/√D, causal) v gives")
    fd = check_gradients(answer, [x, wq, wk, wv], name="one_head")
    if not fd.passed:
        found = fd.error or f"max error {fd.max_error:.2g}"
        raise Wrong(f"the output is right but its gradients are not ({found}): some part was "
                    "computed outside the tape (on .value) and the tape cannot differentiate it.")
    return f"its output matches NumPy and its gradients finite differences ({fd.max_error:.0e})"


# -- 11.split_heads ----------------------------------------------------------------------------

def _split_straight(tape, x, heads):  # planted: cuts the sequence
    b, t, c = x.shape
    return tape.reshape(x, (b, heads, t, c // heads))


def _merge_straight(tape, y):  # planted: H and T not swapped back
    b, h, t, d = y.shape
    return tape.reshape(y, (b, t, h * d))


def _split_right(tape, x, heads):
    b, t, c = x.shape
    return tape.transpose(tape.reshape(x, (b, t, heads, c // heads)), 1, 2)


def _merge_right(tape, y):
    b, h, t, d = y.shape
    return tape.reshape(tape.transpose(y, 1, 2), (b, t, h * d))

@exercise("11.split_heads", title="many heads: (B, T, C) ↔ (B, H, T, D) by reshape and transpose",
          hints=("A reshape only regroups the numbers of each row: (B, T, C) becomes (B, T, H, D) "
                 "with D = C // H, each head's D numbers side by side.",
                 "The heads must sit before T for a batched matmul over (B, H): swap axes 1 and 2 "
                 "with tape.transpose(…, 1, 2).",
                 "Merging undoes both in reverse order: tape.transpose(y, 1, 2), then "
                 "tape.reshape(…, (B, T, H * D))."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "straight reshape": ((_split_straight, _merge_right), "cuts the sequence, not the channels"),
              "merge without the transpose": ((_split_right, _merge_straight), "swap H and T back first"),
              "one function": (_split_right, "the two functions"),
              "heads last": ((lambda tape, x, h: tape.reshape(x, (*x.shape[:2], h, -1)), _merge_right),
                             "where it should be [2, 3, 5, 4]"),
          },
          answer=("split_heads", "merge_heads"), alternate_cell='''
# Exercise 11.split_heads · (B, T, C) → (B, H, T, D) and back, with D = C / H
def split_heads(tape, x, heads):
    return tape.transpose(tape.reshape(x, (*x.shape[:2], heads, -1)), 2, 1)

def merge_heads(tape, y):
    B, H, T, D = y.shape
    return tape.reshape(tape.transpose(y, -3, -2), (B, T, -1))
''', solution_cell='''
# Exercise 11.split_heads · (B, T, C) → (B, H, T, D) and back, with D = C / H
def split_heads(tape, x, heads):
    B, T, C = x.shape
    y = tape.reshape(x, (B, T, heads, C // heads))   # cut each position's C channels into H pieces
    return tape.transpose(y, 1, 2)                   # (B, H, T, D): each head a (T, D) matrix

def merge_heads(tape, y):
    B, H, T, D = y.shape
    return tape.reshape(tape.transpose(y, 1, 2), (B, T, H * D))   # heads side by side again
''')
def split_heads(answer):
    if isinstance(answer, np.ndarray) and answer.ndim == 1:
        answer = list(answer)  # a pair as any sequence, as every grader takes it
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise Wrong("this exercise takes the two functions, (split_heads, merge_heads).")
    split, merge = answer
    rng = np.random.default_rng(1111)
    b, t, c, h = 2, 5, 12, 3
    d = c // h
    x, y = rng.normal(size=(b, t, c)), rng.normal(size=(b, h, t, d))
    tape = Tape("cpu64")
    xv, yv = tape.leaf(x), tape.leaf(y)
    on = f"x (B, T, C) = ({b}, {t}, {c}), {h} heads"
    parts = call(split, tape, xv, h, on=on, what="your split_heads")
    if not isinstance(parts, Var):
        raise Wrong(f"split_heads returns the tape's Var (tape.reshape, tape.transpose), got "
                    f"{type(parts).__name__}.")
    value, want = np.asarray(parts.value), x.reshape(b, t, h, d).transpose(0, 2, 1, 3)
    if value.shape == want.shape and np.allclose(value, x.reshape(b, h, t, d)):
        row, col = divmod(t * d, c)  # where head 1's first D numbers came from: flat index t·D
        raise Wrong(f"a straight reshape to (B, H, T, D) cuts the sequence, not the channels: "
                    f"head 1 at position 0 holds x[0, {row}, {col}:{col + d}] where it should hold "
                    f"x[0, 0, {d}:{2 * d}] ({on}); reshape to (B, T, H, D), then swap T and H.")
    compare("split_heads(x)", value, want, on=on, source="x[b, t, h·D:(h+1)·D] gives",
            shape_hint="(B, H, T, D) with D = C / H")
    merged = call(merge, tape, yv, on=f"y (B, H, T, D) = ({b}, {h}, {t}, {d})", what="your merge_heads")
    if not isinstance(merged, Var):
        raise Wrong(f"merge_heads returns the tape's Var, got {type(merged).__name__}.")
    value, want = np.asarray(merged.value), y.transpose(0, 2, 1, 3).reshape(b, t, h * d)
    if value.shape == want.shape and np.allclose(value, y.reshape(b, t, h * d)):
        raise Wrong("merge_heads reshapes (B, H, T, D) straight to (B, T, H·D): position 0 "
                    "then holds pieces of several positions of head 0; swap H and T back first.")
    compare("merge_heads(y)", value, want, on=f"y (B, H, T, D) = ({b}, {h}, {t}, {d})",
            source="y[b, h, t] side by side gives", shape_hint="(B, T, H·D)")
    back = np.asarray(merge(tape, split(tape, xv, h)).value)
    compare("merge_heads(split_heads(x))", back, x, on=on, source="x itself gives")
    return "split gives each head its D channels of every position, and merge puts them back"

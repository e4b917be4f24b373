"""Lesson 09, backprop by hand: the byte MLP's backward rules in NumPy, graded against the tape."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...autodiff.gradcheck import check_gradients
from ...autodiff.operations import LAYER_NORM_EPS, cross_entropy, layer_norm
from ...autodiff.tape import Tape
from ..common.graders import Wrong, call, compare, describe, parts
from ..common.grading import exercise


def in_float64(got: Any, on: str) -> Any:
    """`got` (an array, or a tuple of them) unless one is float32 or float16: the next cells compare
    lesson 9's answers with the tape's float64 to 1e-9 of rounding, and the capstone's race to 1e-9."""
    low = [a.dtype for a in (got if isinstance(got, (tuple, list)) else [got])
           if getattr(a, "dtype", None) in (np.float32, np.float16)]
    if low:
        raise Wrong(f"your function returns {low[0]} ({on}): the lesson's next cells compare it with the "
                    "tape's float64 gradients to rounding (1e-9 of the largest), and the capstone's race "
                    f"to 1e-9, where {low[0]}'s rounding (1 part in {1 / np.finfo(low[0]).eps:.0e}) shows; "
                    "keep the arrays in float64, as they come, without converting them.")
    return got


def _logits_cases(rng):
    yield "random logits (5 rows, 7 tokens)", rng.normal(size=(5, 7)) * 2, rng.integers(0, 7, 5)
    yield "logits near 1000", rng.normal(size=(3, 4)) + 1000.0, np.array([0, 3, 1])


def _softmax(z):  # for the planted mistakes below
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _onehot(targets, v):
    return np.eye(v)[targets]

@exercise("09.dlogits", title="d loss / d logits = (softmax − onehot) / N",
          hints=("Start from the softmax of each row, the model's predicted distribution: the "
                 "gradient is what it predicted minus what it should have predicted.",
                 "Subtract the row's max before np.exp, or logits near 1000 overflow. Then subtract "
                 "1 at each row's target (d[np.arange(N), targets] -= 1).",
                 "Finally divide everything by N, the number of rows: the loss is a mean over the "
                 "batch."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "sign flipped": (lambda z, y: (_onehot(y, z.shape[1]) - _softmax(z)) / len(y),
                               "dlogits[1, 0] is 0.1981 where the tape gives −0.1981"),
              "no 1/N": (lambda z, y: _softmax(z) - _onehot(y, z.shape[1]),
                         "is −0.9906 where the tape gives −0.1981"),
              "no row max": (lambda z, y: (np.exp(z) / np.exp(z).sum(1, keepdims=True)
                                           - _onehot(y, z.shape[1])) / len(y),
                             "is nan where the tape gives −0.26916, on logits near 1000"),
              "softmax over the batch": (lambda z, y: (np.exp(z) / np.exp(z).sum(0, keepdims=True)
                                                       - _onehot(y, z.shape[1])) / len(y),
                                         "where the tape gives"),
          },
          answer="dlogits_of", alternate_cell='''
# Exercise 09.dlogits · the gradient of the mean cross-entropy with respect to the logits
def dlogits_of(logits, targets):
    N, V = logits.shape
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))   # log-softmax first
    return (np.exp(log_probs) - np.eye(V)[targets]) / N
''', solution_cell='''
# Exercise 09.dlogits · the gradient of the mean cross-entropy with respect to the logits
def dlogits_of(logits, targets):
    """(softmax(logits) − onehot(targets)) / N, shape (N, V)."""
    e = np.exp(logits - logits.max(axis=1, keepdims=True))   # the row max keeps exp finite
    d = e / e.sum(axis=1, keepdims=True)                     # softmax: what the model predicted
    d[np.arange(len(targets)), targets] -= 1.0               # minus what it should have
    return d / len(targets)                                  # the loss is a mean over N rows
''')
def dlogits(answer):
    for on, logits, targets in _logits_cases(np.random.default_rng(9)):
        tape = Tape("cpu64")
        z = tape.leaf(logits)
        want = tape.backward(cross_entropy(tape, z, targets))[z]
        on = f"{on}, targets {targets.tolist()}"
        got = in_float64(call(answer, logits.copy(), targets.copy(), on=on), on)
        compare("dlogits", got, want, on=on, source="the tape gives")
    return "matches the tape's fused cross-entropy, large logits included"


@exercise("09.linear_backward", title="the backward of y = x @ W + b",
          hints=("Every gradient has the shape of what it is the gradient of: dx like x (B, I), dW "
                 "like W (I, O), db like b (O,). Let the shapes pick the products.",
                 "dx = dy @ W.T is (B, O) @ (O, I); dW = x.T @ dy is (I, B) @ (B, O), summed over "
                 "the batch by the product itself.",
                 "b was broadcast over the B rows, so db sums dy over them: dy.sum(axis=0). Return "
                 "(dx, dW, db)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "dW transposed": (lambda x, w, dy: (dy @ w.T, dy.T @ x, dy.sum(0)), "dW has W's shape (I, O)"),
              "db not summed": (lambda x, w, dy: (dy @ w.T, x.T @ dy, dy),
                                "db has shape [5, 3] where it should be [3]"),
              "db summed over the wrong axis": (lambda x, w, dy: (dy @ w.T, x.T @ dy, dy.sum(1)),
                                                "db has shape [5] where it should be [3]"),
              "dx without the transpose": (lambda x, w, dy: (dy @ w, x.T @ dy, dy.sum(0)),
                                           "raised ValueError"),
              "two values": (lambda x, w, dy: (dy @ w.T, x.T @ dy), "and got 2 values"),
          },
          answer="linear_backward", alternate_cell='''
# Exercise 09.linear_backward · y = x @ W + b: from dy, return dx, dW, db
def linear_backward(x, W, dy):
    dx = np.einsum("bo,io->bi", dy, W)       # the indices say which products are summed
    dW = np.einsum("bi,bo->io", x, dy)
    db = np.einsum("bo->o", dy)
    return dx, dW, db
''', solution_cell='''
# Exercise 09.linear_backward · y = x @ W + b: from dy, return dx, dW, db
def linear_backward(x, W, dy):
    """y = x @ W + b with x (B, I), W (I, O), dy (B, O). Return dx (B, I), dW (I, O), db (O,)."""
    dx = dy @ W.T                 # (B, O) @ (O, I): each input collects what it fed
    dW = x.T @ dy                 # (I, B) @ (B, O): summed over the batch
    db = dy.sum(axis=0)           # b was stretched over the B rows
    return dx, dW, db
''')
def linear_backward(answer):
    rng = np.random.default_rng(19)
    x, w = rng.normal(size=(5, 4)), rng.normal(size=(4, 3))
    b, dy = rng.normal(size=3), rng.normal(size=(5, 3))
    tape = Tape("cpu64")
    xv, wv, bv = tape.leaf(x), tape.leaf(w), tape.leaf(b)
    grads = tape.backward(tape.sum((xv @ wv + bv) * dy))
    on = "x (5, 4), W (4, 3), dy (5, 3)"
    got = in_float64(call(answer, x.copy(), w.copy(), dy.copy(), on=on), on)
    got = parts(got, 3, "linear_backward returns three arrays, (dx, dW, db)")
    shapes = {"dx": "dx has x's shape (B, I): dy @ W.T", "dW": "dW has W's shape (I, O): x.T @ dy",
              "db": "db has b's shape (O,): sum dy over the rows, axis 0"}
    for name, mine, var in zip(["dx", "dW", "db"], got, [xv, wv, bv]):
        compare(name, mine, grads[var], on=on, source="the tape gives", shape_hint=shapes[name])
    return "dx, dW and db match the tape's"


@exercise("09.tanh_backward", title="tanh's rule from its saved output",
          hints=("The derivative of tanh can be written with tanh itself, which the forward pass "
                 "already saved as `out`.",
                 "tanh′(a) = 1 − tanh²(a) = 1 − out²: no need to know a.",
                 "Multiply the incoming gradient by it: dout * (1 - out**2)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "forgot the square": (lambda out, dout: dout * (1 - out),
                                    "is −4.036 where the tape gives −0.06819"),
              "treated out as the input": (lambda out, dout: dout * (1 - np.tanh(out) ** 2),
                                           "where the tape gives"),
              "no upstream gradient": (lambda out, dout: 1 - out**2, "is 0.9908 where the tape gives −1.669"),
          },
          answer="tanh_backward", alternate_cell='''
# Exercise 09.tanh_backward · out = tanh(a): from dout, return d loss / d a
tanh_backward = lambda out, dout: dout * (1 + out) * (1 - out)    # 1 − out², factored
''', solution_cell='''
# Exercise 09.tanh_backward · out = tanh(a): from dout, return d loss / d a
def tanh_backward(out, dout):
    """out = tanh(a), dout = d loss / d out (same shape). Return d loss / d a."""
    return dout * (1.0 - out**2)  # tanh' = 1 − tanh², read from the saved output
''')
def tanh_backward(answer):
    rng = np.random.default_rng(29)
    a, dout = rng.uniform(-2.5, 2.5, size=(4, 6)), rng.normal(size=(4, 6))
    tape = Tape("cpu64")
    av = tape.leaf(a)
    out = tape.tanh(av)
    want = tape.backward(tape.sum(out * dout))[av]
    on = describe(out=out.value) + ", dout random (4, 6)"
    compare("d loss / d a", in_float64(call(answer, out.value.copy(), dout.copy(), on=on), on), want, on=on,
            source="the tape gives")
    return "matches the tape's tanh rule, saturated units included"


def _buffered(tokens, dvectors, vocab):  # planted: the trap
    dtable = np.zeros((vocab, dvectors.shape[-1]))
    dtable[tokens] += dvectors  # buffered: repeated tokens keep one contribution
    return dtable

@exercise("09.embedding_backward", title="the embedding's scatter-add",
          hints=("The forward pass copied row k of the table into every position holding token k, so "
                 "row k receives the sum of those positions' gradients.",
                 "Start from np.zeros((vocab, C)). `dtable[tokens] += dvectors` looks right but is "
                 "buffered: a token repeated in the batch keeps only one contribution.",
                 "np.add.at(dtable, tokens, dvectors) adds every position unbuffered, repeats "
                 "included."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "replace instead of accumulate": (_buffered, "one of its four contributions, not their sum"),
              "nothing scattered": (lambda tok, dv, v: np.zeros((v, dv.shape[-1])),
                                    "dtable[0, 1] is 0 where the tape"),
          },
          answer="embedding_backward", alternate_cell='''
# Exercise 09.embedding_backward · scatter-add every position's gradient into its token's row
def embedding_backward(tokens, dvectors, vocab):
    dtable = np.zeros((vocab, dvectors.shape[-1]))
    for position, token in np.ndenumerate(tokens):
        dtable[token] += dvectors[position]          # one position at a time: repeats add up
    return dtable
''', solution_cell='''
# Exercise 09.embedding_backward · scatter-add every position's gradient into its token's row
def embedding_backward(tokens, dvectors, vocab):
    """tokens (B, T) integers, dvectors (B, T, C). Return dtable (vocab, C): row k is the sum
    of dvectors[b, t] over every (b, t) where tokens[b, t] == k."""
    dtable = np.zeros((vocab, dvectors.shape[-1]))
    np.add.at(dtable, tokens, dvectors)   # unbuffered: repeated tokens add up
    return dtable
''')
def embedding_backward(answer):
    rng = np.random.default_rng(39)
    tokens = np.array([[3, 1, 3, 0], [2, 3, 1, 3]])  # token 3 four times, 1 twice: on purpose
    table, dvectors = rng.normal(size=(6, 5)), rng.normal(size=(2, 4, 5))
    tape = Tape("cpu64")
    tv = tape.leaf(table)
    want = tape.backward(tape.sum(tape.gather_rows(tv, tokens) * dvectors))[tv]
    on = f"tokens {tokens.tolist()}, vocab 6, C 5"
    got = in_float64(call(answer, tokens.copy(), dvectors.copy(), 6, on=on), on)
    trap = np.zeros((6, 5))
    trap[tokens] += dvectors
    if np.shape(got) == trap.shape and np.allclose(got, trap) and not np.allclose(got, want):
        raise Wrong(f"row 3 holds one of its four contributions, not their sum ({on}): "
                    "`dtable[tokens] += g` is buffered, every repeat overwrites the others; "
                    "np.add.at(dtable, tokens, dvectors) adds them all.")
    compare("dtable", got, want, on=on, source="the tape gives")
    return "every repeated token receives the sum of its contributions, as on the tape"


@exercise("09.layer_norm_dx", title="LayerNorm's input gradient",
          hints=("x̂ = (x − mean)·inv_std: x reaches x̂ directly, through the mean (a shift of all of "
                 "x) and through σ (a stretch of all of x). Each path contributes.",
                 "The shift removes the mean of g, the stretch removes the part of g along x̂: "
                 "g − mean(g) − x̂·mean(g·x̂), then times inv_std.",
                 "Both means are over the last axis with keepdims=True, so they broadcast over C: "
                 "inv_std * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "no projection term": (lambda xh, s, g: s * (g - g.mean(-1, keepdims=True)),
                                     "dx[0, 3] is −0.3745"),
              "no mean(g)": (lambda xh, s, g: s * (g - xh * (g * xh).mean(-1, keepdims=True)),
                             "dx[1, 0] is 0.9309"),
              "no 1/sigma": (lambda xh, s, g: g - g.mean(-1, keepdims=True)
                             - xh * (g * xh).mean(-1, keepdims=True), "dx[0, 0] is −1.009"),
              "sign of the projection": (lambda xh, s, g: s * (g - g.mean(-1, keepdims=True)
                                                               + xh * (g * xh).mean(-1, keepdims=True)),
                                         "dx[0, 3] is −0.6752 where finite differences give −0.07381"),
          },
          answer="layer_norm_dx", alternate_cell='''
# Exercise 09.layer_norm_dx · dx from x̂, s = 1/σ and g = dy·w
def layer_norm_dx(xhat, inv_std, g):
    C = g.shape[-1]
    total = g.sum(axis=-1, keepdims=True)               # the means written as sums over C
    along = (g * xhat).sum(axis=-1, keepdims=True)
    return (C * g - total - xhat * along) * inv_std / C
''', solution_cell='''
# Exercise 09.layer_norm_dx · dx from x̂, s = 1/σ and g = dy·w
def layer_norm_dx(xhat, inv_std, g):
    """dx = inv_std · (g − mean(g) − xhat · mean(g · xhat)), means over the last axis."""
    mean_g = g.mean(axis=-1, keepdims=True)                  # a shift of all of x
    mean_gx = (g * xhat).mean(axis=-1, keepdims=True)        # a stretch of all of x
    return inv_std * (g - mean_g - xhat * mean_gx)
''')
def layer_norm_dx(answer):
    rng = np.random.default_rng(49)
    x, g, eps = rng.normal(size=(3, 6)) * 2 + 1, rng.normal(size=(3, 6)), LAYER_NORM_EPS
    centered = x - x.mean(-1, keepdims=True)
    inv_std = 1.0 / np.sqrt((centered**2).mean(-1, keepdims=True) + eps)
    ones, zeros = np.ones(6), np.zeros(6)
    numeric = check_gradients(lambda t, xv: layer_norm(t, xv, t.constant(ones), t.constant(zeros), eps),
                              [x], weights=g).numeric[0]
    on = "x random (3, 6), g random (3, 6)"
    got = in_float64(call(answer, centered * inv_std, inv_std.copy(), g.copy(), on=on), on)
    compare("dx", got, numeric, on=on, source="finite differences give", tolerance=1e-6)
    return "matches finite differences of LayerNorm"

"""Lesson 08, the leaky abstraction: sigmoid's gradient, Huber's gradient, global-norm clipping."""

from __future__ import annotations

import numpy as np

from ...autodiff.operations import huber
from ...autodiff.tape import Tape
from ...backends import get_backend
from ...errors import fmt
from ...optim import clip_by_global_norm as package_clip
from ..common.graders import call, compare, parts
from ..common.grading import exercise


@exercise("08.sigmoid_grad", title="the sigmoid's local gradient",
          hints=("Compute the sigmoid itself first, s = 1 / (1 + e⁻ˣ): its derivative is written "
                 "with s.",
                 "σ'(x) = s·(1 − s). Work it out once by hand at x = 0 (s = ½) to see the largest "
                 "value it can take.",
                 "Return s * (1 - s), element by element: it is never more than 1/4, and near 0 "
                 "once |x| is large (the unit has saturated)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "tanh's rule": (lambda x: 1 - (1 / (1 + np.exp(-x))) ** 2, "where the tape gives"),
              "σ(−x)": (lambda x: np.exp(-x) / (1 + np.exp(-x)), "sigmoid_grad(x)[0] is 1"),
          },
          answer="sigmoid_grad", alternate_cell='''
# Exercise 08.sigmoid_grad · σ'(x) for every element of x
sigmoid_grad = lambda x: (1 - np.tanh(x / 2) ** 2) / 4    # σ(x) = (1 + tanh(x/2)) / 2
''', solution_cell='''
# Exercise 08.sigmoid_grad · σ'(x) for every element of x
def sigmoid_grad(x):
    s = 1 / (1 + np.exp(-x))
    return s * (1 - s)        # two numbers that add up to 1: their product is at most 1/4
''')
def sigmoid_grad(answer):
    x = np.linspace(-12.0, 12.0, 25)
    tape = Tape("cpu64")
    leaf = tape.leaf(x)
    want = tape.backward(tape.sum(tape.sigmoid(leaf)))[leaf]
    on = "x = −12, −11, …, 12"
    got = call(answer, x.copy(), on=on)
    compare("sigmoid_grad(x)", got, want, on=on, tolerance=1e-9, source="the tape gives")
    return f"matches the tape from −12 to 12; its largest value is {float(np.max(got)):.2f}, at x = 0"


@exercise("08.huber_grad", title="the gradient of the Huber loss",
          hints=("Huber has two pieces: ½r² inside [−δ, δ], δ(|r| − δ/2) outside. Differentiate "
                 "each.",
                 "Inside, the gradient is r; outside it is δ·sign(r): constant, never zero, however "
                 "large the error.",
                 "Both pieces together are r clipped to [−δ, δ]: np.clip(r, -delta, delta)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "clipped to zero (the DQN bug)": (lambda r, delta=1.0: np.where(np.abs(r) <= delta, r, 0.0),
                                                "huber_grad(r)[0] is 0 where the tape gives −1"),
              "the squared loss's": (lambda r, delta=1.0: r, "huber_grad(r)[0] is −3"),
          },
          answer="huber_grad", alternate_cell='''
# Exercise 08.huber_grad · d huber(r) / d r for every error r
def huber_grad(r, delta=1.0):
    return np.where(np.abs(r) <= delta, r, delta * np.sign(r))   # the two pieces, side by side
''', solution_cell='''
# Exercise 08.huber_grad · d huber(r) / d r for every error r
def huber_grad(r, delta=1.0):
    return np.clip(r, -delta, delta)    # r inside [−δ, δ]; a constant ±δ outside, never 0
''')
def huber_grad(answer):
    r = np.array([-3.0, -1.5, -0.8, -0.2, 0.5, 1.2, 2.5])
    for delta in (1.0, 2.0):
        tape = Tape("cpu64")
        q = tape.leaf(r)
        want = tape.backward(tape.sum(huber(tape, q, tape.constant(np.zeros_like(r)), delta)))[q]
        on = f"r = {fmt(r, limit=7)}, delta = {delta}"
        compare("huber_grad(r)", call(answer, r.copy(), delta, on=on), want, on=on,
                source="the tape gives")
    return "matches the tape's Huber rule, inside and outside [−δ, δ], for δ = 1 and 2"


@exercise("08.clip_by_global_norm", title="clipping by the global norm",
          hints=("Treat all the gradients as one long vector: its length is the global norm. "
                 "Clipping shortens that vector without turning it.",
                 "norm = √(Σ over tensors of Σ g²); only when norm > max_norm, every tensor is "
                 "multiplied by the same factor max_norm / norm.",
                 "scale = min(1.0, max_norm / norm), then return [g * scale for g in grads]: one "
                 "factor for all, never more than 1."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "each by its own norm": (lambda grads, m: [g * min(1.0, m / np.linalg.norm(g)) for g in grads],
                                       "clip_by_global_norm gives"),
              "by value": (lambda grads, m: [np.clip(g, -m, m) for g in grads], "clip_by_global_norm gives"),
              "always rescaled": (  # stretches gradients below the threshold too
                  lambda grads, m: [g * m / np.sqrt(sum(np.sum(x * x) for x in grads)) for g in grads],
                  "grads[0][2, 0] is 0.345 where smallem's clip_by_global_norm gives 0.2474 (off by 0.0977), "
                  "on 3 gradients of global norm 0.717"),
          },
          answer="clip_by_global_norm", alternate_cell='''
# Exercise 08.clip_by_global_norm · one factor for all gradients, so the step keeps its direction
def clip_by_global_norm(grads, max_norm):
    total = 0.0
    for g in grads:
        total += float((g ** 2).sum())
    norm = total ** 0.5                        # the notebook has np, not math
    if norm <= max_norm:
        return tuple(grads)                    # short enough: left as they are
    return tuple(g * (max_norm / norm) for g in grads)
''', solution_cell='''
# Exercise 08.clip_by_global_norm · one factor for all gradients, so the step keeps its direction
def clip_by_global_norm(grads, max_norm):
    norm = np.sqrt(sum(np.sum(g * g) for g in grads))    # all gradients as one long vector
    scale = min(1.0, max_norm / norm)                    # shrink only, never stretch
    return [g * scale for g in grads]
''')
def clip_by_global_norm(answer):
    be = get_backend("cpu64")
    rng = np.random.default_rng(11)
    shapes = [(3, 2), (2,), (4,)]
    for size, max_norm in [(5.0, 1.0), (0.3, 1.0), (40.0, 2.5)]:
        grads = [rng.normal(size=s) * size for s in shapes]
        want, norm = package_clip(be, grads, max_norm)
        on = f"3 gradients of global norm {norm:.3g}, max_norm {max_norm}"
        got = call(answer, [g.copy() for g in grads], max_norm, on=on)
        got = parts(got, len(grads), f"return a list of {len(grads)} gradients, one per input, on {on}")
        for k, (g, w) in enumerate(zip(got, want)):
            compare(f"grads[{k}]", g, w, on=on, source="smallem's clip_by_global_norm gives")
    return "matches smallem.optim.clip_by_global_norm above and below the threshold"

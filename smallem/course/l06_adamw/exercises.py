"""Lesson 06, AdamW: bias correction and one update, graded against the package's AdamW."""

from __future__ import annotations

import numpy as np

from ...autodiff.tape import Tape
from ...errors import fmt
from ...nn import Parameter
from ...optim import ADAMW_BETAS, ADAMW_EPS, AdamW
from ..common.graders import Wrong, call, compare, describe, differing, parts
from ..common.grading import exercise


def _step(optimizer: AdamW, param: Parameter, g: np.ndarray) -> None:
    """One step of the package's optimizer with gradient exactly g (the loss Σ g·p)."""
    tape = Tape(param.backend)
    optimizer.step([param], tape.backward(tape.sum(tape.mul(param.var(tape), tape.constant(g)))))


@exercise("06.bias_correction", title="AdamW's bias correction",
          hints=("m starts at 0 and moves only 1 − β1 of the way towards each new gradient, so early "
                 "on it is far too small. How much too small, after t steps of a constant gradient?",
                 "After t steps from zero with a constant gradient g, m = (1 − β1ᵗ)·g: divide by "
                 "1 − β1ᵗ to undo it. t counts from 1 (the first step).",
                 "m̂ = m / (1 − beta1**t) and v̂ = v / (1 − beta2**t), each with its own β; return "
                 "(m_hat, v_hat)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "not corrected": (lambda m, v, t, b1, b2: (m, v),
                                "m_hat is m itself at step t = 1: after t steps from "
                                "zero, m holds only 1 − β1ᵗ = 0.1 of the mean"),
              "t − 1": (lambda m, v, t, b1, b2: (m / (1 - b1 ** (t - 1)), v / (1 - b2 ** (t - 1))),
                        "m_hat[0] is inf where m / (1 − β1ᵗ) gives 65.6105"),
          },
          answer="corrected", alternate_cell='''
# Exercise 06.bias_correction · undo the start at zero of both running means
def corrected(m, v, t, beta1=0.9, beta2=0.999):
    return [moment / (1 - np.power(beta, t)) for moment, beta in ((m, beta1), (v, beta2))]
''', solution_cell='''
# Exercise 06.bias_correction · undo the start at zero of both running means
def corrected(m, v, t, beta1=0.9, beta2=0.999):
    m_hat = m / (1 - beta1 ** t)    # after t steps, m holds only 1 − β1ᵗ of the mean
    v_hat = v / (1 - beta2 ** t)
    return m_hat, v_hat
''')
def bias_correction(answer):
    rng = np.random.default_rng(9)
    p = Parameter(rng.normal(size=3), "cpu64")
    optimizer = AdamW(lr=0.01, weight_decay=0.0)
    b1, b2 = optimizer.beta1, optimizer.beta2
    for t in range(1, 5):
        g = rng.normal(size=3) * 10.0 ** rng.integers(-3, 3)
        before = p.numpy()
        _step(optimizer, p, g)
        m, v = np.array(optimizer.m[p]), np.array(optimizer.v[p])
        on = f"step t = {t}, " + describe(m=m, v=v)
        out = call(answer, m.copy(), v.copy(), t, b1, b2, on=on)
        m_hat, v_hat = parts(out, 2, "corrected should return two arrays, m_hat and v_hat")
        # Each moment on its own, relatively (v is as small as 1e-9): a wrong m̂ can hide behind a
        # v̂ wrong in the matching way when only the step m̂/√v̂ is compared.
        for name, got, raw, beta, k in [("m_hat", m_hat, m, b1, 1), ("v_hat", v_hat, v, b2, 2)]:
            letter = name[0]
            if np.shape(got) == raw.shape and np.allclose(np.asarray(got, dtype=np.float64), raw,
                                                          rtol=1e-12, atol=0):
                raise Wrong(f"{name} is {letter} itself at step t = {t}: after t steps from zero, {letter} "
                            f"holds only 1 − β{k}ᵗ = {fmt(1 - beta ** t, 6)} of the mean it estimates; "
                            "divide by that.")
            compare(name, got, raw / (1 - beta ** t), on=on, tolerance=1e-9, floor=1e-300,
                    source=f"{letter} / (1 − β{k}ᵗ) gives")
        m_hat, v_hat = np.asarray(m_hat, dtype=np.float64), np.asarray(v_hat, dtype=np.float64)
        step = optimizer.lr * m_hat / (np.sqrt(v_hat) + optimizer.eps)
        moved = before - p.numpy()
        if not np.all(np.abs(step - moved) <= 1e-9):  # lr = 0.01: a step is about 0.01
            i = int(np.argmax(np.abs(step - moved)))
            mine, theirs = differing(step[i], moved[i])
            raise Wrong(f"with your m̂ and v̂ at step t = {t}, lr·m̂/(√v̂ + ε) moves p[{i}] by {mine} where "
                        f"the package's AdamW moved it by {theirs}, on {describe(m=m, v=v)}.")
    return ("m̂ = m/(1 − β1ᵗ) and v̂ = v/(1 − β2ᵗ) at steps 1 to 4, and lr·m̂/(√v̂ + ε) is exactly how far "
            "the package's AdamW moved p")


def _adamw_l2(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):  # planted: Adam with L2
    g = g + weight_decay * p  # the decay goes through m and v
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return p - lr * (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps), m, v


def _adamw_eps_inside(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):  # planted: √(v̂ + ε)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return p - lr * ((m / (1 - beta1 ** t)) / np.sqrt(v / (1 - beta2 ** t) + eps) + weight_decay * p), m, v


def _adamw_uncorrected(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):  # planted
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return p - lr * (m / (np.sqrt(v) + eps) + weight_decay * p), m, v

@exercise("06.adamw_step", title="one AdamW update of one tensor",
          hints=("Four steps: update the two running means, correct them for their start at zero, "
                 "take the step, decay the weights. Return the new p, m and v (m and v uncorrected: "
                 "they carry over to the next step).",
                 "m ← β1·m + (1 − β1)·g and v ← β2·v + (1 − β2)·g²; then m̂ = m/(1 − β1ᵗ), "
                 "v̂ = v/(1 − β2ᵗ), as in 06.bias_correction.",
                 "p ← p − lr·(m̂/(√v̂ + ε) + wd·p): ε is added after the square root of the corrected "
                 "v̂, and the decay sits beside the step (never added to g), read from p before the "
                 "update."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "L2 through m and v": (_adamw_l2, "m[0, 0] is"),
              "no bias correction": (_adamw_uncorrected,
                                     "p[0, 1] is −0.7559 where the package's AdamW gives −0.7343"),
              "ε inside the root": (_adamw_eps_inside, "ε went inside the square root"),
          },
          answer="adamw_step", alternate_cell='''
# Exercise 06.adamw_step · one update of p, with its running means m and v, at step t
def adamw_step(p, g, m, v, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    """PyTorch's order: the decay first, the bias corrections folded into the step size."""
    decayed = p * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * np.square(g)
    denominator = np.sqrt(v) / math.sqrt(1 - beta2 ** t) + eps      # √v̂ + ε
    return decayed - lr / (1 - beta1 ** t) * m / denominator, m, v
''', solution_cell='''
# Exercise 06.adamw_step · one update of p, with its running means m and v, at step t
def adamw_step(p, g, m, v, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    m = beta1 * m + (1 - beta1) * g                  # running mean of the gradient
    v = beta2 * v + (1 - beta2) * g * g              # running mean of its square
    m_hat = m / (1 - beta1 ** t)                     # bias correction
    v_hat = v / (1 - beta2 ** t)
    p = p - lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * p)   # decay beside g
    return p, m, v
''')
def adamw_step(answer):
    rng = np.random.default_rng(10)
    for scale in (1.0, 1e-5):  # gradients near 1, then as small as a seldom read byte's row gets
        start = rng.normal(size=(2, 3))
        param = Parameter(start, "cpu64", decay=True)
        optimizer = AdamW(lr=0.01, weight_decay=0.1)
        p, m, v = start.copy(), np.zeros((2, 3)), np.zeros((2, 3))
        for t in range(1, 4):
            g = rng.normal(size=(2, 3)) * scale
            _step(optimizer, param, g)
            on = f"step t = {t} with lr = 0.01, weight_decay = 0.1, g = {describe(g=g)[4:]}"
            out = call(answer, p.copy(), g.copy(), m.copy(), v.copy(), t, 0.01, *ADAMW_BETAS, ADAMW_EPS,
                       0.1, on=on)
            before = p
            p, m, v = (np.asarray(x, dtype=np.float64)
                       for x in parts(out, 3, "adamw_step should return three arrays: the new p, m and v"))
            compare("m", m, optimizer.m[param], on=on, source="the package's AdamW holds")
            compare("v", v, optimizer.v[param], on=on, source="the package's AdamW holds")
            want = param.numpy()
            _where_eps_goes(p, want, before, m, v, t)
            compare("p", p, want, on=on, tolerance=1e-9, source="the package's AdamW gives")
    return ("p, m and v agree with the package's AdamW over three steps, decay included, on gradients "
            "near 1 and near 1e-5")


EPS_PLACE = ("ε is added to the square root of the corrected second moment, m̂/(√v̂ + ε), as the "
             "package (and PyTorch) do")


def _where_eps_goes(p: np.ndarray, want: np.ndarray, before: np.ndarray, m: np.ndarray, v: np.ndarray,
                    t: int, lr: float = 0.01, beta1: float = ADAMW_BETAS[0], beta2: float = ADAMW_BETAS[1],
                    eps: float = ADAMW_EPS, wd: float = 0.1) -> None:
    """A p off because ε went inside the root, √(v̂ + ε), or beside the uncorrected √v (the Adam
    paper's faster form, off by about 1e-8): say where it goes. Inside is invisible on gradients
    near 1 and shortens every step on small ones, so the grader's second series has those."""
    if p.shape != want.shape or np.allclose(p, want, rtol=0, atol=1e-9):
        return
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    if np.allclose(p, before - lr * (m_hat / np.sqrt(v_hat + eps) + wd * before), rtol=1e-12, atol=1e-15):
        shorter = float(np.max(np.sqrt(v_hat + eps) / (np.sqrt(v_hat) + eps)))
        raise Wrong(f"p is off by {fmt(np.max(np.abs(p - want)), 2)} at step t = {t}, on gradients of about "
                    f"{fmt(float(np.sqrt(np.mean(v_hat))), 1)}: ε went inside the square root, √(v̂ + ε); "
                    f"{EPS_PLACE}. Inside, ε = 1e-8 weighs as much as a √v̂ of 1e-4, so on small gradients "
                    f"like these each step is up to {shorter:.0f} times shorter, and over many steps the "
                    "parameters they move (a seldom read byte's row) fall behind the package's: the "
                    "capstone's race would drift apart.")
    faster = before - lr * np.sqrt(1 - beta2**t) / (1 - beta1**t) * m / (np.sqrt(v) + eps) - lr * wd * before
    if np.allclose(p, faster, rtol=1e-12, atol=1e-15):
        raise Wrong(f"p is off by {fmt(np.max(np.abs(p - want)), 2)} at step t = {t}: {EPS_PLACE}; the "
                    "Adam paper's faster form lr·√(1 − β2ᵗ)/(1 − β1ᵗ)·m/(√v + ε) puts ε beside the "
                    "uncorrected √v instead.")

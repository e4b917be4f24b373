"""Lesson 06, AdamW: bias correction and one update, graded against the package's AdamW."""

from __future__ import annotations

import numpy as np

from ..autodiff.tape import Tape
from ..nn import Parameter
from ..optim import AdamW
from .grading import Wrong, call, compare, describe, exercise


def _step(optimizer: AdamW, param: Parameter, g: np.ndarray) -> None:
    """One step of the package's optimizer with gradient exactly g (the loss Σ g·p)."""
    tape = Tape(param.backend)
    optimizer.step([param], tape.backward(tape.sum(tape.mul(param.var(tape), tape.constant(g)))))


@exercise("06.bias_correction", title="AdamW's bias correction",
          hint="after t steps from zero, m holds only 1 − β1ᵗ of the mean it estimates: "
               "m̂ = m / (1 − β1ᵗ), v̂ = v / (1 − β2ᵗ), with t counted from 1.",
          answer="corrected", solution_cell='''
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
    for t in range(1, 5):
        g = rng.normal(size=3) * 10.0 ** rng.integers(-3, 3)
        before = p.numpy()
        _step(optimizer, p, g)
        m, v = np.array(optimizer.m[p]), np.array(optimizer.v[p])
        on = f"step t = {t}, " + describe(m=m, v=v)
        out = call(answer, m.copy(), v.copy(), t, optimizer.beta1, optimizer.beta2, on=on)
        if not isinstance(out, tuple) or len(out) != 2:
            raise Wrong("corrected should return two arrays, m_hat and v_hat.")
        m_hat, v_hat = (np.asarray(x, dtype=np.float64) for x in out)
        with np.errstate(all="ignore"):
            step = optimizer.lr * m_hat / (np.sqrt(v_hat) + optimizer.eps)
        moved = before - p.numpy()
        i = int(np.argmax(np.abs(step - moved)))
        if not np.all(np.abs(step - moved) <= 1e-9):  # lr = 0.01: a step is about 0.01
            raise Wrong(f"with your m̂ and v̂ at step t = {t}, lr·m̂/(√v̂ + ε) moves p[{i}] by "
                        f"{step[i]:.4g} where the package's AdamW moved it by {moved[i]:.4g}, "
                        f"on {describe(m=m, v=v)}.")
    return "with your m̂ and v̂, lr·m̂/(√v̂ + ε) is exactly how far the package's AdamW moved p, at steps 1 to 4"


@exercise("06.adamw_step", title="one AdamW update of one tensor",
          hint="m ← β1·m + (1 − β1)·g; v ← β2·v + (1 − β2)·g²; correct both by 1 − βᵗ; then "
               "p ← p − lr·(m̂/(√v̂ + ε) + wd·p), the decay beside the gradient (not added to g) "
               "and read from the p before the update.",
          answer="adamw_step", solution_cell='''
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
    start = rng.normal(size=(2, 3))
    param = Parameter(start, "cpu64", decay=True)
    optimizer = AdamW(lr=0.01, weight_decay=0.1)
    p, m, v = start.copy(), np.zeros((2, 3)), np.zeros((2, 3))
    for t in range(1, 4):
        g = rng.normal(size=(2, 3))
        _step(optimizer, param, g)
        on = f"step t = {t} with lr = 0.01, weight_decay = 0.1, g = {describe(g=g)[4:]}"
        out = call(answer, p.copy(), g.copy(), m.copy(), v.copy(), t, 0.01, 0.9, 0.999, 1e-8,
                   0.1, on=on)
        if not isinstance(out, tuple) or len(out) != 3:
            raise Wrong("adamw_step should return three arrays: the new p, m and v.")
        p, m, v = (np.asarray(x, dtype=np.float64) for x in out)
        compare("m", m, optimizer.m[param], on=on, source="the package's AdamW holds")
        compare("v", v, optimizer.v[param], on=on, source="the package's AdamW holds")
        compare("p", p, param.numpy(), on=on, tolerance=1e-9, source="the package's AdamW gives")
    return "p, m and v agree with the package's AdamW over three steps, decay included"

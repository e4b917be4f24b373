"""Lesson 04, finite differences: the central difference and the relative-error scale."""

from __future__ import annotations

import math

import numpy as np

from ...autodiff.gradcheck import EPSILON, check_gradients, tape_gradients
from ...errors import fmt
from ..common.graders import Wrong, call, compare, differing, number
from ..common.grading import exercise


def _one_sided(f, x, eps=EPSILON):  # planted
    grad = np.zeros_like(x)
    base = f(x)
    for i in np.ndindex(x.shape):
        saved = x[i]
        x[i] = saved + eps
        grad[i] = (f(x) - base) / eps
        x[i] = saved
    return grad


def _no_restore(f, x, eps=EPSILON):  # planted
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        x[i] += eps
        up = f(x)
        x[i] -= 2 * eps
        grad[i] = (up - f(x)) / (2 * eps)
    return grad

@exercise("04.central_difference", title="the central difference",
          hints=("Nudge one element at a time, and watch how f moves: the slope along that element is "
                 "its gradient. np.ndindex(x.shape) visits every index, whatever the shape.",
                 "For element i: f with x[i] + eps, f with x[i] − eps, and their difference divided "
                 "by 2·eps (the central difference: its error shrinks like eps², not eps).",
                 "Save x[i] before nudging and put it back after both evaluations: x is the caller's "
                 "array, and the next element must be nudged from the original point."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "one-sided": (_one_sided, "the tape's exact gradient is"),
              "x not restored": (_no_restore, "left x changed"),
              "the whole x nudged": (
                  lambda f, x, eps=EPSILON: np.array([(f(x + eps) - f(x - eps)) / (2 * eps)]),
                  "has shape [1] where it should be [5]"),
          },
          answer="numeric_gradient", alternate_cell='''
# Exercise 04.central_difference · d f / d x for every element of x, by nudging it both ways
def numeric_gradient(f, x, eps=1e-5):
    grad = np.empty(x.shape)
    for i in np.ndindex(*x.shape):
        up, down = x.copy(), x.copy()          # nudged copies: x itself is never touched
        up[i] += eps
        down[i] -= eps
        grad[i] = (f(up) - f(down)) / (2 * eps)
    return grad
''', solution_cell='''
# Exercise 04.central_difference · d f / d x for every element of x, by nudging it both ways
def numeric_gradient(f, x, eps=1e-5):
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        saved = x[i]
        x[i] = saved + eps
        up = f(x)
        x[i] = saved - eps
        down = f(x)
        x[i] = saved                           # put it back before moving on
        grad[i] = (up - down) / (2 * eps)
    return grad
''')
def central_difference(answer):
    def fn(tape, a):  # f(x) = Σ w·tanh(x)·x, on the tape
        return tape.mul(tape.tanh(a), a)

    rng = np.random.default_rng(6)
    for shape in [(5,), (2, 3)]:
        x = rng.uniform(-1.5, 1.5, size=shape)
        _, (exact,), w = tape_gradients(fn, [x])
        f = lambda v: float(np.sum(w * np.tanh(v) * v))  # noqa: E731
        on = f"f(x) = Σ w·tanh(x)·x at x = {fmt(x)}, eps = 1e-4"
        given = x.copy()
        got = call(answer, f, given, 1e-4, on=on)
        if not np.array_equal(given, x):
            i = tuple(int(k) for k in np.argwhere(given != x)[0])
            raise Wrong(f"your function left x changed (x{list(i)} is {fmt(given[i])} instead of "
                        f"{fmt(x[i])}): put each element back after nudging it.")
        compare("the result", got, exact, on=on, source="the tape's exact gradient is")
    return "within 1e-6 of the tape's exact gradient at eps = 1e-4, with x left as it was"


@exercise("04.relative_error", title="the relative-error scale of a gradient check",
          hints=("An absolute difference says nothing for gradients near 1000, and a purely relative "
                 "one explodes for gradients near 1e-9. The scale max(|a|, |n|, 1) is relative above "
                 "1 and absolute below.",
                 "Element by element: |analytic − numeric| / max(|analytic|, |numeric|, 1), with "
                 "np.maximum twice (np.max would take one number over the whole array).",
                 "Return the largest of those ratios, as a float."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "no floor of 1": (lambda a, n: float(np.max(np.abs(a - n) / np.maximum(np.abs(a), np.abs(n)))),
                                "two tiny gradients"),
              "absolute error": (lambda a, n: float(np.max(np.abs(a - n))), "two large gradients"),
          },
          answer="relative_error", alternate_cell='''
# Exercise 04.relative_error · the worst element, on the scale max(|a|, |n|, 1)
def relative_error(analytic, numeric):
    worst = 0.0
    for a, n in zip(np.ravel(analytic), np.ravel(numeric)):    # one pair at a time
        worst = max(worst, abs(a - n) / max(abs(a), abs(n), 1.0))
    return worst
''', solution_cell='''
# Exercise 04.relative_error · the worst element, on the scale max(|a|, |n|, 1)
def relative_error(analytic, numeric):
    scale = np.maximum(np.maximum(np.abs(analytic), np.abs(numeric)), 1.0)   # never below 1
    return float(np.max(np.abs(analytic - numeric) / scale))
''')
def relative_error(answer):
    result = check_gradients(lambda t, a: t.tanh(a), [np.linspace(-1.0, 1.0, 6)])
    examples = [
        (np.array([1e-9, -2e-9]), np.array([3e-9, -1e-9]), 2e-9,
         "two tiny gradients, both right for all practical purposes"),
        (np.array([250.0, -1200.0]), np.array([250.0002, -1200.0006]), 0.0002 / 250.0002,
         "two large gradients, right to 7 digits"),
        (result.analytic[0], result.numeric[0], result.max_error, "gradcheck's tanh check"),
    ]
    for analytic, numeric, want, what in examples:
        on = f"{what}, analytic = {fmt(analytic)}, numeric = {fmt(numeric)}"
        got = number(call(answer, analytic.copy(), numeric.copy(), on=on), "the result")
        if not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-18):
            mine, theirs = differing(got, want)
            raise Wrong(f"relative_error is {mine} where it should be {theirs}, on {on}.")
    return "agrees with gradcheck's max_error, for tiny gradients and large ones"

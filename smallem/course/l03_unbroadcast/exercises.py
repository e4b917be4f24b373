"""Lesson 03, undoing the broadcast: unbroadcast, and the rules of sum and mean."""

from __future__ import annotations

import numpy as np

from ...autodiff.tape import unbroadcast as package_unbroadcast
from ...backends import get_backend
from ..common.graders import call, compare, grade_rule
from ..common.grading import exercise


def _unbroadcast_left_only(grad, shape):  # planted: a stretched dimension of size 1 stays
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    return grad

@exercise("03.unbroadcast", title="unbroadcast: sum over the stretched dimensions",
          hints=("Broadcasting stretched the input in two ways: it added dimensions on the left, and "
                 "it repeated dimensions of size 1. Every copy sent a gradient back: undo each "
                 "stretch by summing.",
                 "While grad has more dimensions than shape, sum over axis 0: those dimensions were "
                 "added on the left.",
                 "Then, for every dimension where shape has 1 and grad does not, sum over it with "
                 "keepdims=True so it stays as size 1."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "unchanged": (lambda grad, shape: grad, "has shape [4, 3] where it should be [3]"),
              "leading dimensions only": (_unbroadcast_left_only, "where it should be [4, 1]"),
          },
          answer="unbroadcast_by_hand", alternate_cell='''
# Exercise 03.unbroadcast · give `grad` the input's `shape` back
def unbroadcast_by_hand(grad, shape):
    extra = grad.ndim - len(shape)                  # dimensions added on the left
    stretched = [extra + d for d, size in enumerate(shape) if size == 1 and grad.shape[extra + d] != 1]
    return grad.sum(axis=tuple(range(extra)) + tuple(stretched)).reshape(shape)   # one sum for all
''', solution_cell='''
# Exercise 03.unbroadcast · give `grad` the input's `shape` back
def unbroadcast_by_hand(grad, shape):
    while grad.ndim > len(shape):                  # dimensions added on the left
        grad = grad.sum(axis=0)
    for dim, size in enumerate(shape):             # dimensions of size 1 that were stretched
        if size == 1 and grad.shape[dim] != 1:
            grad = grad.sum(axis=dim, keepdims=True)
    return grad
''')
def unbroadcast(answer):
    be = get_backend("cpu64")
    rng = np.random.default_rng(3)
    pairs = [((4, 3), (3,)), ((4, 3), (4, 3)), ((2, 4, 3), (4, 1)), ((2, 4, 3), (1, 3)),
             ((2, 4, 3), ()), ((2, 4, 3), (2, 1, 3)), ((2, 4, 3), (1, 4, 1))]
    for grad_shape, shape in pairs:
        grad = rng.normal(size=grad_shape)
        on = f"a gradient of shape {list(grad_shape)} for an input of shape {list(shape)}"
        got = call(answer, grad.copy(), shape, on=on)
        compare("the result", got, package_unbroadcast(be, grad, shape), on=on,
                source="smallem's unbroadcast gives")
    return f"matches smallem's unbroadcast on {len(pairs)} pairs of shapes"


def _reduction_cases(rng):
    a, b = rng.normal(size=(4, 3)), rng.normal(size=(2, 3, 4))
    return [(a, None, False), (a, 0, False), (a, 1, True), (b, 1, False), (b, -1, True)]


@exercise("03.sum_rule", title="the gradient of a sum is a broadcast",
          hints=("Every element of a was added exactly once into one output: nudging it by ε moves that "
                 "output by ε. So each element receives its output's gradient, unchanged.",
                 "That is a broadcast of grad back to a's shape (np.broadcast_to(grad, a.shape)), "
                 "which works as it is for dim=None and for keepdim=True.",
                 "With keepdim=False the summed dimension is gone from grad: put it back as size 1 "
                 "with np.expand_dims(grad, dim) before broadcasting. Return a tuple (da,)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "summed dimension not put back": (
                  lambda be, grad, out, a, dim, keepdim: (np.broadcast_to(grad, a.shape),),
                  "raised ValueError"),
              "ones": (lambda be, grad, out, a, dim, keepdim: (np.ones_like(a),), "finite differences give"),
          },
          answer="sum_rule", alternate_cell='''
# Exercise 03.sum_rule · c = sum(a, dim, keepdim): from grad = dc, return (da,)
def sum_rule(be, grad, out, a, dim, keepdim):
    kept = np.sum(a, axis=dim, keepdims=True).shape      # the sum's shape, its dimension kept as 1
    return (np.ones_like(a) * np.reshape(grad, kept),)
''', solution_cell='''
# Exercise 03.sum_rule · c = sum(a, dim, keepdim): from grad = dc, return (da,)
def sum_rule(be, grad, out, a, dim, keepdim):
    if dim is not None and not keepdim:
        grad = np.expand_dims(grad, dim)           # the summed dimension back, as size 1
    return (np.broadcast_to(grad, a.shape),)       # each element of a gets its sum's gradient
''')
def sum_rule(answer):
    for k, (a, dim, keepdim) in enumerate(_reduction_cases(np.random.default_rng(4))):
        grade_rule(answer, "sum", lambda t, x: t.sum(x, dim, keepdim), [a], "a",
                   args=(dim, keepdim), seed=k)
    return "matches finite differences for sums over everything, one dimension, with and without keepdim"


@exercise("03.mean_rule", title="the gradient of a mean",
          hints=("A mean is a sum divided by a count: start from your sum_rule.",
                 "Each element moves its mean by 1/n of its own change, where n is how many "
                 "elements that mean averaged.",
                 "n is a.size when dim is None, a.shape[dim] otherwise: the sum's rule with grad / n "
                 "(and the same np.expand_dims when keepdim is False)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "n = a.size always": (lambda be, grad, out, a, dim, keepdim: (np.broadcast_to(
                  (grad if dim is None or keepdim else np.expand_dims(grad, dim)) / a.size, a.shape),),
                                    "da[0, 1] is −0.1209"),
              "no division": (lambda be, grad, out, a, dim, keepdim: (np.broadcast_to(
                  grad if dim is None or keepdim else np.expand_dims(grad, dim), a.shape),),
                              "finite differences give"),
          },
          answer="mean_rule", alternate_cell='''
# Exercise 03.mean_rule · c = mean(a, dim, keepdim): from grad = dc, return (da,)
def mean_rule(be, grad, out, a, dim, keepdim):
    n = a.size // np.size(out)                 # how many elements each mean averaged
    if dim is not None and not keepdim:
        grad = np.expand_dims(grad, axis=dim)
    return [np.zeros_like(a) + grad / n]
''', solution_cell='''
# Exercise 03.mean_rule · c = mean(a, dim, keepdim): from grad = dc, return (da,)
def mean_rule(be, grad, out, a, dim, keepdim):
    n = a.size if dim is None else a.shape[dim]    # how many elements each mean averaged
    if dim is not None and not keepdim:
        grad = np.expand_dims(grad, dim)
    return (np.broadcast_to(grad / n, a.shape),)
''')
def mean_rule(answer):
    for k, (a, dim, keepdim) in enumerate(_reduction_cases(np.random.default_rng(5))):
        grade_rule(answer, "mean", lambda t, x: t.mean(x, dim, keepdim), [a], "a",
                   args=(dim, keepdim), seed=k)
    return "matches finite differences for means over everything and over one dimension"

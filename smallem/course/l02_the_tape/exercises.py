"""Lesson 02, the tape: local rules graded by finite differences; accumulate, never replace."""

from __future__ import annotations

import numpy as np

from ...errors import fmt
from ..common.graders import Wrong, call, cases, compare, grade_rule
from ..common.grading import exercise


@exercise("02.exp_rule", title="the local rule of exp",
          hints=("A local rule answers one question: if c moves by dc, how does the loss see a? "
                 "That is dc times the derivative of exp at a.",
                 "The derivative of eᵃ is eᵃ itself, and the forward pass already computed it: it is "
                 "`out`. Nothing needs recomputing.",
                 "Return a tuple with one gradient per input, here one: (grad * out,), with the "
                 "trailing comma."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "the input for the output": (lambda be, grad, out, a: (grad * a,),
                                           "da[2] is 0.9312 where finite differences give 3.025"),
              "no tuple": (lambda be, grad, out, a: grad * out, "returns a tuple with one gradient"),
          },
          answer="exp_rule", alternate_cell='''
# Exercise 02.exp_rule · c = exp(a): from grad = dc, return (da,)
exp_rule = lambda be, grad, out, a: [grad * np.exp(a)]    # recomputed, in a list
''', solution_cell='''
# Exercise 02.exp_rule · c = exp(a): from grad = dc, return (da,)
def exp_rule(be, grad, out, a):
    return (grad * out,)    # d eᵃ/da = eᵃ, which is the output: nothing to recompute
''')
def exp_rule(answer):
    worst = max(grade_rule(answer, "exp", lambda t, a: t.exp(a), [x], "a", seed=k)
                for k, x in enumerate(cases(2, [(5,), (2, 3)])))
    return f"matches finite differences on two random inputs (relative error {worst:.0e})"


@exercise("02.div_rule", title="the local rule of div",
          hints=("Treat one input as a constant while you differentiate with respect to the other; "
                 "then multiply by the incoming gradient dc.",
                 "With b fixed, a/b is a times the constant 1/b: da = dc / b.",
                 "With a fixed, d(a/b)/db = −a/b², so db = −dc·a/b² (which is −dc·out/b). Mind the "
                 "minus sign, and return (da, db)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "sign of db flipped": (lambda be, grad, out, a, b: (grad / b, grad * a / b ** 2),
                                     "db[1] is −1.203 where finite differences give 1.203"),
              "db without a": (lambda be, grad, out, a, b: (grad / b, -grad / b ** 2),
                               "finite differences give"),
          },
          answer="div_rule", alternate_cell='''
# Exercise 02.div_rule · c = a / b: from grad = dc, return (da, db)
def div_rule(be, grad, out, a, b):
    return grad / b, -grad * out / b     # −a/b² is −out/b: the forward's output reused
''', solution_cell='''
# Exercise 02.div_rule · c = a / b: from grad = dc, return (da, db)
def div_rule(be, grad, out, a, b):
    da = grad / b               # a is multiplied by 1/b
    db = -grad * a / b**2       # d(a/b)/db = −a/b²  (= −c/b: out could be reused)
    return da, db
''')
def div_rule(answer):
    worst = max(grade_rule(answer, "div", lambda t, a, b: t.div(a, b), pair, "ab", seed=k)
                for k, pair in enumerate([cases(3, [(4,), (4,)]), cases(4, [(2, 3), (2, 3)])]))
    return f"matches finite differences on two random inputs (relative error {worst:.0e})"


def _acc_replace(grads, index, grad):  # planted: pitfall 1
    grads[index] = grad


def _acc_inplace(grads, index, grad):  # planted: += changes the array another slot shares
    if grads[index] is None:
        grads[index] = grad
    else:
        grads[index] += grad

@exercise("02.accumulate", title="accumulate, never replace",
          hints=("A value used twice receives one contribution per use: each must add to what "
                 "grads[index] already holds, never replace it.",
                 "The first contribution finds None in grads[index]: store it as it is. Later ones: "
                 "store the sum of what is there and the new one.",
                 "Write grads[index] = grads[index] + grad, a new array: `+=` would change in place an "
                 "array that another node may be holding too (add sends one gradient to both inputs)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "replace": (_acc_replace, "replaced the first instead of adding"),
              "add in place": (_acc_inplace, "also changed grads[1]"),
          },
          answer="accumulate", alternate_cell='''
# Exercise 02.accumulate · add a contribution into a node's gradient
def accumulate(grads, index, grad):
    if grads[index] is None:
        grads[index] = np.copy(grad)     # a copy of its own: adding into it later touches no one else's
    else:
        grads[index] += grad
''', solution_cell='''
# Exercise 02.accumulate · add a contribution into a node's gradient
def accumulate(grads, index, grad):
    existing = grads[index]
    grads[index] = grad if existing is None else existing + grad   # a new array, never +=
''')
def accumulate(answer):
    # The contributions backward makes for loss = a·b + a at a = 2, b = 3, in its order:
    # the addition sends 1 to a; the multiplication then sends b = 3 to a and a = 2 to b.
    grads = [None, None]
    call(answer, grads, 0, np.ones(2), on="grads = [None, None], index 0", returns=False)
    if grads[0] is None:
        raise Wrong("after accumulate(grads, 0, [1, 1]) on grads = [None, None], `grads[index]` is "
                    "still None: store the contribution in grads[index] (the function returns nothing).")
    compare("grads[0]", grads[0], np.ones(2), on="the first contribution [1, 1] to an empty slot")
    call(answer, grads, 0, np.full(2, 3.0), on="a second contribution", returns=False)
    call(answer, grads, 1, np.full(2, 2.0), on="a contribution to b", returns=False)
    if np.allclose(np.asarray(grads[0], dtype=float), 3.0):
        raise Wrong("after the contributions [1, 1] and then [3, 3] to a (used twice), "
                    "grads[0] is [3, 3]: the second replaced the first instead of adding to it.")
    compare("grads[0]", grads[0], np.full(2, 4.0), on="a used twice, contributions [1, 1] then [3, 3]")
    compare("grads[1]", grads[1], np.full(2, 2.0), on="b used once, contribution [2, 2]")
    # The same array may arrive at two nodes (add sends one gradient to both inputs).
    shared = np.array([1.0, 2.0])
    grads = [None, None]
    for index, g in [(0, shared), (1, shared), (0, np.array([10.0, 10.0]))]:
        call(answer, grads, index, g, on="a shared contribution", returns=False)
    if not np.array_equal(grads[1], [1.0, 2.0]):
        raise Wrong(f"adding [10, 10] into grads[0] also changed grads[1] (now {fmt(grads[1])}): "
                    "both held the same incoming array, and it was changed in place; "
                    "store existing + grad, a new array.")
    return "contributions add up, and no array another node holds is ever changed"

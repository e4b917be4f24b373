"""Lesson 01, the chain rule by hand: gradients reasoned backwards, graded by the tape."""

from __future__ import annotations

import numpy as np

from ..autodiff.tape import Tape
from ..models import toy
from .grading import Wrong, call, compare, describe, exercise, number


@exercise("01.two_paths", title="a value used twice receives the sum of both paths",
          hint="a is used twice, as the factor and inside the sum: add what each path "
               "sends back; the multiplication sends each factor the gradient times the other.",
          answer=("grad_a", "grad_b"), solution_cell='''
# Exercise 01.two_paths · loss = (a + b) × a, at a = 2 and b = 3. Reason backwards, as above.
s = 2.0 + 3.0      # the sum a + b, which the multiplication uses as one factor
d_s = 2.0          # loss = s × a: s receives the gradient 1 times the other factor, a
grad_a = s + d_s   # a is used twice: as the factor (it gets s) and in the sum (it gets d_s)
grad_b = d_s       # the sum passes d_s on unchanged to b
''')
def two_paths(answer):
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise Wrong("give two numbers, grad_a and grad_b.")
    tape = Tape("cpu64")
    a, b = tape.leaf(2.0), tape.leaf(3.0)
    grads = tape.backward((a + b) * a)
    for name, got, var in [("grad_a", answer[0], a), ("grad_b", answer[1], b)]:
        compare(name, number(got, name), float(grads[var]), source="the tape gives",
                on="loss = (a + b) × a at a = 2, b = 3")
    return "the tape gives d loss/da = 2a + b = 7 and d loss/db = a = 2"


@exercise("01.backward_221", title="the backward pass of the 2-2-1 network",
          hint="go back step by step: dŷ = ŷ − y; dW2 = dŷ·a1; d_a1 = dŷ·W2; d_z1 = d_a1 where "
               "z1 > 0, else 0 (ReLU); dW1 = outer(d_z1, x).",
          answer="backward_221", solution_cell='''
# Exercise 01.backward_221 · the backward pass of the 2-2-1 network, for any weights
def backward_221(x, W1, W2, y):
    """x (2,), W1 (2, 2), W2 (2,), y a number -> dW1 (2, 2), dW2 (2,) of L = ½(ŷ − y)²."""
    z1 = W1 @ x
    a1 = np.maximum(z1, 0.0)
    d_y_hat = W2 @ a1 - y            # the output's error
    dW2 = d_y_hat * a1               # error signal × the activation that came in
    d_z1 = d_y_hat * W2 * (z1 > 0)   # back through W2, then through the ReLU's gate
    dW1 = np.outer(d_z1, x)          # error signal × the input that came in
    return dW1, dW2
''')
def backward_221(answer):
    rng = np.random.default_rng(1)
    inputs = [(toy.X, toy.W1, toy.W2, toy.Y),                                  # the seed's
              (np.array([1.0, 2.0]), np.array([[-0.3, 0.1], [0.4, 0.2]]),      # unit 1 dead
               np.array([0.7, -0.4]), 0.5),
              (rng.normal(size=2), rng.normal(size=(2, 2)), rng.normal(size=2), 1.5)]
    for x, W1, W2, y in inputs:
        on = describe(x=x, W1=W1, W2=W2, y=y)
        out = call(answer, x.copy(), W1.copy(), W2.copy(), y, on=on)
        if not isinstance(out, tuple) or len(out) != 2:
            raise Wrong("backward_221 should return two arrays, dW1 and dW2.")
        record = toy.forward_backward(W1, W2, x, y)  # the tape's pass
        compare("dW1", out[0], record.dW1, on=on, source="the tape gives")
        compare("dW2", out[1], record.dW2, on=on, source="the tape gives")
    return "dW1 and dW2 match the tape on the seed's weights, on weights with a dead unit, and on random ones"

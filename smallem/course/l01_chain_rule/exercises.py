"""Lesson 01, the chain rule by hand: gradients reasoned backwards, graded by the tape."""

from __future__ import annotations

import numpy as np

from ...autodiff.tape import Tape
from ...models import toy
from ..common.graders import call, compare, describe, number, parts
from ..common.grading import exercise


@exercise("01.two_paths", title="a value used twice receives the sum of both paths",
          hints=("Draw the graph: s = a + b, then loss = s × a. Start at the loss with gradient 1 "
                 "and walk back one operation at a time.",
                 "The multiplication sends each factor the incoming gradient times the other factor: "
                 "s receives a = 2, and a receives s = 5. The sum then passes s's gradient on, unchanged, "
                 "to both a and b.",
                 "a is used twice, so its gradient is the sum of both paths: 5 from the multiplication "
                 "plus 2 through the sum. b has one path only."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "grad_a without the sum's path": ((5.0, 2.0), "grad_a is 5 where the tape gives 7"),
              "grad_b given a's factor": ((7.0, 5.0), "grad_b is 5 where the tape gives 2"),
          },
          answer=("grad_a", "grad_b"), alternate_cell='''
# Exercise 01.two_paths · loss = (a + b) × a, at a = 2 and b = 3. Reason backwards, as above.
# Multiplied out, loss = a² + a·b: d/da = 2a + b and d/db = a, whole numbers at a = 2, b = 3
grad_a, grad_b = 2 * 2 + 3, 2
''', solution_cell='''
# Exercise 01.two_paths · loss = (a + b) × a, at a = 2 and b = 3. Reason backwards, as above.
s = 2.0 + 3.0      # the sum a + b, which the multiplication uses as one factor
d_s = 2.0          # loss = s × a: s receives the gradient 1 times the other factor, a
grad_a = s + d_s   # a is used twice: as the factor (it gets s) and in the sum (it gets d_s)
grad_b = d_s       # the sum passes d_s on unchanged to b
''')
def two_paths(answer):
    answer = parts(answer, 2, "give two numbers, grad_a and grad_b")
    tape = Tape("cpu64")
    a, b = tape.leaf(2.0), tape.leaf(3.0)
    grads = tape.backward((a + b) * a)
    for name, got, var in [("grad_a", answer[0], a), ("grad_b", answer[1], b)]:
        compare(name, number(got, name), float(grads[var]), source="the tape gives",
                on="loss = (a + b) × a at a = 2, b = 3")
    return "the tape gives d loss/da = 2a + b = 7 and d loss/db = a = 2"


def _no_relu_gate(x, W1, W2, y):  # planted: wrong only where a unit is dead
    a1 = np.maximum(W1 @ x, 0)
    return np.outer((W2 @ a1 - y) * W2, x), (W2 @ a1 - y) * a1


def _outer_transposed(x, W1, W2, y):  # planted
    a1 = np.maximum(W1 @ x, 0)
    return np.outer(x, (W2 @ a1 - y) * W2 * (W1 @ x > 0)), (W2 @ a1 - y) * a1

@exercise("01.backward_221", title="the backward pass of the 2-2-1 network",
          hints=("Run the forward pass first (z1 = W1 @ x, a1 = ReLU(z1), ŷ = W2 @ a1) and keep every "
                 "intermediate: the backward pass reads them. Then walk from the loss back to W1.",
                 "The loss ½(ŷ − y)² sends ŷ − y back. A weight's gradient is the error signal that "
                 "reaches its output times the value that came into it: dW2 = (ŷ − y)·a1.",
                 "Back through W2: d_a1 = (ŷ − y)·W2; through the ReLU: keep it where z1 > 0, zero "
                 "elsewhere (a dead unit passes nothing); then dW1 = np.outer(d_z1, x)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "no ReLU gate": (_no_relu_gate, "dW1[0, 1] is −1.148 where the tape gives 0 (off by 1.15)"),
              "outer product transposed": (_outer_transposed, "where the tape gives"),
          },
          answer="backward_221", alternate_cell='''
# Exercise 01.backward_221 · the backward pass of the 2-2-1 network, for any weights
def backward_221(x, W1, W2, y):
    """One hidden unit at a time, with loops: as the graph is drawn."""
    pre = [W1[j, 0] * x[0] + W1[j, 1] * x[1] for j in range(2)]
    hidden = [max(p, 0.0) for p in pre]
    error = W2[0] * hidden[0] + W2[1] * hidden[1] - y      # ŷ − y
    grad_W2 = np.array([error * h for h in hidden])
    grad_W1 = np.zeros((2, 2))
    for j in range(2):
        if pre[j] > 0:                                     # a dead unit passes nothing back
            for k in range(2):
                grad_W1[j, k] = error * W2[j] * x[k]
    return [grad_W1, grad_W2]
''', solution_cell='''
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
        out = parts(out, 2, "backward_221 should return two arrays, dW1 and dW2")
        record = toy.forward_backward(W1, W2, x, y)  # the tape's pass
        compare("dW1", out[0], record.dW1, on=on, source="the tape gives")
        compare("dW2", out[1], record.dW2, on=on, source="the tape gives")
    return "dW1 and dW2 match the tape on the seed's weights, on weights with a dead unit, and on random ones"

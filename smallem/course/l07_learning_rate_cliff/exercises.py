"""Lesson 07, the learning-rate cliff: where the first hidden unit dies, graded by the toy net."""

from __future__ import annotations

import numpy as np

from ...errors import fmt
from ...models import toy
from ..common.graders import Wrong, call, compare, number
from ..common.grading import exercise


@exercise("07.z1_after_step", title="the hidden pre-activations after one step",
          hints=("One step changes W1 to W1 − lr·dW1. z1 is W1 @ x: what does that change do to it?",
                 "dW1 = outer(dz1, x), so the step changes z1 by −lr·outer(dz1, x) @ x.",
                 "outer(dz1, x) @ x is dz1 times (x·x): z1 after the step is "
                 "record.z1 − lr·record.dz1·(record.x @ record.x)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "no |x|²": (lambda r, lr: r.z1 - lr * r.dz1, "where the network gives"),
              "uphill": (lambda r, lr: r.z1 + lr * r.dz1 * (r.x @ r.x), "z1 after the step[0] is"),
          },
          answer="z1_after_step", alternate_cell='''
# Exercise 07.z1_after_step · z1 after one gradient step at rate lr, from a step record
def z1_after_step(record, lr):
    new_W1 = record.W1 - lr * np.outer(record.dz1, record.x)   # take the step on W1 ...
    return new_W1 @ record.x                                    # ... and run the layer again
''', solution_cell='''
# Exercise 07.z1_after_step · z1 after one gradient step at rate lr, from a step record
def z1_after_step(record, lr):
    # W1 ← W1 − lr·outer(dz1, x), so z1 = W1 @ x moves by −lr·dz1·(x·x)
    return record.z1 - lr * record.dz1 * (record.x @ record.x)
''')
def z1_after_step(answer):
    for lr, step in [(0.1, 0), (0.5, 0), (0.3, 1), (0.5, 1)]:
        record = toy.gradient_descent(lr, steps=step)[step]
        after = toy.forward_backward(*toy.gradient_step(record, lr))
        on = f"lr = {lr}, step {step}: z1 = {fmt(record.z1)}, dz1 = {fmt(record.dz1)}"
        compare("z1 after the step", call(answer, record, lr, on=on), after.z1, on=on,
                source="the network gives")
    return "matches the network's z1 after one step, from step 0 and step 1, at four rates"


def _first_death_other_unit() -> float:  # planted: solves for h1, whose dz1 is negative
    r = toy.forward_backward()
    return float(r.z1[0] / (r.dz1[0] * (r.x @ r.x)))

@exercise("07.first_death_lr", title="the learning rate at which a unit dies at the first step",
          hints=("Your z1_after_step says where each unit's pre-activation lands after one step. A "
                 "unit dies when its z1 reaches 0.",
                 "z1_j − η·dz1_j·(x·x) falls as η grows only for a unit with dz1_j > 0: that is h2, "
                 "with z1 = 1.0, dz1 = 0.575, and x·x = 5.",
                 "Set 1.0 − η·0.575·5 = 0 and solve for η; give it as a plain number (a float)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "the seed's 0.5": (0.5, "but smaller rates kill it too"),
              "too small": (0.2, "both units are still alive"),
              "the other unit": (_first_death_other_unit(), "a learning rate is positive"),
          },
          answer="lr_first_death", env={"toy": toy}, hand_on=lambda a: number(a, "lr_first_death"),
          alternate_cell='''
# Exercise 07.first_death_lr · the smallest η at which one step kills a hidden unit
lr_first_death = [1.0 / (0.575 * 5)]   # h2: 1.0 − η·0.575·5 = 0, read off the printout
''', solution_cell='''
# Exercise 07.first_death_lr · the smallest η at which one step kills a hidden unit
record = toy.forward_backward()       # step 0 of the seed's network
# unit j dies when z1_j − η·dz1_j·(x·x) reaches 0; only h2 (dz1 > 0) is pushed down
lr_first_death = float(record.z1[1] / (record.dz1[1] * (record.x @ record.x)))
''')
def first_death_lr(answer):
    lr = number(answer, "lr_first_death")
    start = toy.forward_backward()
    pushed_down = start.dz1 > 0
    want = float(np.min(start.z1[pushed_down] / (start.dz1[pushed_down] * (start.x @ start.x))))
    if abs(lr - want) <= 1e-3 * want:
        return f"at η = {fmt(want)} one step brings h2's pre-activation exactly to 0"
    if lr <= 0:
        raise Wrong(f"a learning rate is positive, and lr_first_death is {fmt(lr)}.")
    z1 = toy.forward_backward(*toy.gradient_step(start, lr)).z1
    if not (z1 <= 0).any():
        raise Wrong(f"at η = {fmt(lr)} one step leaves z1 = {fmt(z1)}: both units are still alive, "
                    "so the first death needs a larger rate.")
    raise Wrong(f"at η = {fmt(lr)} one step gives z1 = {fmt(z1)}, a dead unit, but smaller rates "
                "kill it too: find the rate where its z1 reaches exactly 0.")

"""Diagnostics: dead units on hand-made activations."""

import numpy as np
import pytest

from smallem import SmallemError, Tape
from smallem.lessons.diagnostics import dead_fraction, dead_units


def test_dead_units_are_zero_for_every_input(backend):
    # 3 inputs × 4 units: unit 1 is zero everywhere (dead), unit 3 is active on one input only
    # (alive: one input is enough to pass a gradient).
    layer1 = np.array([[0.5, 0.0, 2.0, 0.0],
                       [0.1, 0.0, 0.0, 0.0],
                       [0.0, 0.0, 1.0, 3.0]])
    layer2 = np.zeros((3, 2))  # everything dead
    acts = [backend.tensor(layer1), backend.tensor(layer2)]
    masks = dead_units(backend, acts)
    assert masks[0].tolist() == [False, True, False, False]
    assert masks[1].tolist() == [True, True]
    assert dead_fraction(backend, acts) == [0.25, 1.0]


def test_dead_fraction_reads_vars_and_leading_dims():
    tape = Tape()
    a = np.ones((2, 3, 4))  # [B, T, H]: every position counts as an input
    a[..., 2] = -1.0  # negative everywhere: what a pre-ReLU would be, dead too
    act = tape.relu(tape.leaf(a))
    assert dead_fraction("cpu64", [act]) == [0.25]


def test_dead_fraction_wants_a_data_set():
    with pytest.raises(SmallemError, match="dead_units: layer 0"):
        dead_fraction("cpu64", [np.zeros(4)])

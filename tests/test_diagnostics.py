"""Diagnostics: dead units on hand-made activations, norms, and clipping by global norm."""

import numpy as np
import pytest

from smallem import SmallemError, Tape, get_backend
from smallem.lessons.diagnostics import (
    clip_by_global_norm,
    dead_fraction,
    dead_units,
    global_norm,
    gradient_norms,
    norm,
)


def host(backend, x):
    return np.asarray(backend.to_numpy(x), dtype=np.float64)


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


def test_norms(backend):
    g = [backend.tensor([3.0, 4.0]), None, backend.tensor([[12.0]])]
    assert norm(backend, g[0]) == pytest.approx(5.0)
    assert global_norm(backend, g) == pytest.approx(13.0)  # √(9 + 16 + 144)


def test_clip_by_global_norm_scales_all_by_one_factor(backend):
    g = [backend.tensor([3.0, 4.0]), backend.tensor([[12.0]]), None]
    clipped, total = clip_by_global_norm(backend, g, 6.5)
    assert total == pytest.approx(13.0)
    assert clipped[2] is None
    np.testing.assert_allclose(host(backend, clipped[0]), [1.5, 2.0], rtol=1e-6)  # halved
    np.testing.assert_allclose(host(backend, clipped[1]), [[6.0]], rtol=1e-6)
    assert global_norm(backend, clipped) == pytest.approx(6.5, rel=1e-6)


def test_clip_by_global_norm_leaves_small_gradients_alone(backend):
    g = [backend.tensor([0.3, 0.4])]
    clipped, total = clip_by_global_norm(backend, g, 1.0)
    assert total == pytest.approx(0.5)
    np.testing.assert_allclose(host(backend, clipped[0]), [0.3, 0.4], rtol=1e-6)


def test_clip_by_global_norm_refuses_bad_input():
    with pytest.raises(SmallemError, match="the clipping norm must be a positive number"):
        clip_by_global_norm("cpu64", [np.ones(2)], 0.0)
    with pytest.raises(SmallemError, match="gradient norm is nan"):
        clip_by_global_norm("cpu64", [np.array([1.0, np.nan])], 1.0)


def test_gradient_norms_per_variable():
    tape = Tape()
    x = tape.leaf(np.array([1.0, 2.0]))
    y = x * 3.0
    grads = tape.backward(tape.sum(y * y))  # d/dy = 2y = [6, 12], d/dx = 3·2y = [18, 36]
    assert gradient_norms(grads, [y, x]) == pytest.approx([np.hypot(6, 12), np.hypot(18, 36)])
    assert gradient_norms(grads, []) == []


def test_global_norm_does_not_overflow_in_float32():
    backend = get_backend("cpu")  # float32: 3e20² = 9e40 is beyond its range of 3.4e38
    g = [backend.tensor([3e20, 4e20]), backend.tensor([0.0])]
    assert global_norm(backend, g) == pytest.approx(5e20, rel=1e-6)
    clipped, total = clip_by_global_norm(backend, g, 1.0)
    np.testing.assert_allclose(host(backend, clipped[0]), [0.6, 0.8], rtol=1e-6)


def test_global_norm_reports_inf_and_nan():
    assert global_norm("cpu64", [np.array([1.0, np.inf])]) == float("inf")
    assert np.isnan(global_norm("cpu64", [np.array([np.nan, 1.0])]))
    with pytest.raises(SmallemError, match="gradient norm is inf"):
        clip_by_global_norm("cpu64", [np.array([np.inf])], 1.0)

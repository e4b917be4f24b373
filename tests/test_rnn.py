"""The vanilla RNN: gradients through time against finite differences, and the eigenvalue
story (|λ| < 1 vanishes, |λ| > 1 explodes)."""

import numpy as np
import pytest

from smallem import SmallemError, Tape
from smallem.autodiff.gradcheck import TOLERANCE, check_gradients
from smallem.models.rnn import (
    RNN,
    hidden_gradient_norms,
    scaled_orthogonal,
    spectral_radius,
    unroll,
    with_spectral_radius,
)


@pytest.mark.parametrize("nonlinearity", ["tanh", "linear"])
def test_gradient_through_time_matches_finite_differences(nonlinearity):
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(2, 4, 3))  # B=2, T=4, C=3

    def last_state(tape, w_xh, w_hh, b, h0):
        return unroll(tape, xs, w_xh, w_hh, b, h0, nonlinearity)[-1]

    inputs = [rng.normal(size=(3, 5)) * 0.6, scaled_orthogonal(5, 0.9, rng), rng.normal(size=5),
              rng.normal(size=(2, 5))]
    result = check_gradients(last_state, inputs, name=f"rnn {nonlinearity}")
    assert result.max_error <= TOLERANCE, result.max_error
    assert np.abs(result.analytic[3]).max() > 1e-3  # h_0 did receive a gradient, four steps back


def test_model_is_a_module_with_named_parameters():
    model = RNN(3, 8, 2, radius=0.9, seed=1)
    tape = Tape(model.backend)
    run = model(tape, np.zeros((4, 6, 3)))
    assert len(run.hidden) == 7 and run.hidden[-1].shape == (4, 8)
    assert run.output.shape == (4, 2)
    assert model.parameter_names() == ["w_xh", "w_hh", "b", "w_hy", "b_y"]
    assert model.parameter_count() == 3 * 8 + 8 * 8 + 8 + 8 * 2 + 2
    # W_hh is read at every one of the 6 steps but bound once: its gradient is the sum.
    grads = tape.backward(tape.sum(run.output))
    assert all(p.grad(grads) is not None for p in model.parameters())


def test_same_model_on_float32():
    xs = np.random.default_rng(0).normal(size=(2, 5, 3))
    norms = [hidden_gradient_norms(RNN(3, 8, radius=0.7, backend=b), xs) for b in ("cpu64", "cpu")]
    np.testing.assert_allclose(norms[1], norms[0], rtol=1e-4)


@pytest.mark.parametrize("orthogonal", [True, False])
def test_recurrent_matrix_has_the_requested_radius(orthogonal):
    model = RNN(2, 16, radius=1.3, orthogonal=orthogonal, seed=2)
    assert spectral_radius(model.w_hh) == pytest.approx(1.3)
    m = with_spectral_radius(np.random.default_rng(0).normal(size=(6, 6)), 0.5)
    assert spectral_radius(m) == pytest.approx(0.5)


def test_linear_rnn_scales_the_gradient_by_the_eigenvalue_per_step():
    xs = np.random.default_rng(0).normal(size=(4, 12, 3))
    for radius in (0.8, 1.25):
        norms = hidden_gradient_norms(RNN(3, 8, radius=radius, nonlinearity="linear"), xs)
        # Orthogonal × radius: each step back multiplies every gradient norm by exactly radius.
        np.testing.assert_allclose(norms[:-1] / norms[1:], radius, rtol=1e-10)


@pytest.mark.parametrize("nonlinearity", ["linear", "tanh"])
def test_eigenvalue_below_one_vanishes_above_one_explodes(nonlinearity):
    xs = 0.1 * np.random.default_rng(0).normal(size=(4, 30, 3))  # small inputs: tanh ≈ linear
    small = hidden_gradient_norms(RNN(3, 16, radius=0.8, nonlinearity=nonlinearity), xs)
    large = hidden_gradient_norms(RNN(3, 16, radius=1.5, nonlinearity=nonlinearity), xs)
    assert small[0] < 1e-2 * small[-1]  # decays going back in time
    assert large[0] > 10 * large[-1]  # grows going back in time


def test_rnn_errors_are_clear():
    with pytest.raises(SmallemError, match="unknown nonlinearity 'relu'"):
        RNN(2, 4, nonlinearity="relu")
    tape = Tape()
    model = RNN(2, 4)
    with pytest.raises(SmallemError, match=r"inputs must be \[batch, time, 2\]"):
        model.forward(tape, np.zeros((3, 2)))

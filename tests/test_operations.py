"""Operations with their own rules: values against plain NumPy, stability, and the fused-kernel
hook (a backend kernel must agree with the reference rule)."""

import numpy as np
import pytest

from smallem import CrossEntropy, Huber, LayerNorm, SmallemError, Tape


def test_cross_entropy_value_and_gradient(backend):
    rng = np.random.default_rng(0)
    logits, targets = rng.normal(size=(6, 5)), np.array([0, 4, 2, 2, 1, 3])
    tape = Tape(backend)
    x = tape.leaf(logits)
    loss = tape.apply(CrossEntropy(targets), [x])
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    expected = -np.log(p[np.arange(6), targets]).mean()
    assert float(backend.to_numpy(loss.value)) == pytest.approx(expected, rel=1e-5)
    onehot = np.eye(5)[targets]
    np.testing.assert_allclose(backend.to_numpy(tape.backward(loss)[x]), (p - onehot) / 6, atol=1e-6)


def test_cross_entropy_is_stable_for_huge_logits():
    tape = Tape()
    x = tape.leaf(np.array([[1e4, -1e4, 0.0], [-1e4, 1e4, 1e4]]))
    loss = tape.apply(CrossEntropy(np.array([0, 2])), [x])
    grad = tape.backward(loss)[x]
    assert np.isfinite(loss.value) and loss.value == pytest.approx(np.log(2) / 2)
    assert np.all(np.isfinite(grad))


def test_cross_entropy_uniform_logits_give_log_vocab():
    tape = Tape()
    loss = tape.apply(CrossEntropy(np.arange(4) % 257), [tape.leaf(np.zeros((4, 257)))])
    assert float(loss.value) == pytest.approx(np.log(257))


def test_layer_norm_matches_numpy():
    rng = np.random.default_rng(0)
    x, w, b = rng.normal(size=(3, 4, 8)), rng.normal(size=8), rng.normal(size=8)
    tape = Tape()
    out = tape.apply(LayerNorm(), [tape.leaf(x), tape.leaf(w), tape.leaf(b)])
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(out.value, ref, atol=1e-12)


def test_huber_keeps_a_constant_gradient_outside_delta():
    tape = Tape()
    pred = tape.leaf(np.array([0.5, 3.0, -10.0]))
    loss = tape.sum(tape.apply(Huber(1.0), [pred, tape.constant(np.zeros(3))]))
    np.testing.assert_allclose(loss.value, 0.125 + 2.5 + 9.5)
    np.testing.assert_allclose(tape.backward(loss)[pred], [0.5, 1.0, -1.0])


@pytest.mark.parametrize("make, message", [
    (lambda t: t.apply(CrossEntropy(np.array([0, 1])), [t.leaf(np.zeros((3, 4)))]), "cross_entropy: logits"),
    (lambda t: t.apply(CrossEntropy(np.array([0, 9])), [t.leaf(np.zeros((2, 4)))]),
     r"targets must be integers in \[0, 4\)"),
    (lambda t: t.apply(LayerNorm(), [t.leaf(np.zeros((2, 4))), t.leaf(np.ones(3)), t.leaf(np.zeros(4))]),
     "layer_norm: input"),
    (lambda t: t.apply(Huber(), [t.leaf(np.zeros(2)), t.leaf(np.zeros(3))]), "huber: prediction"),
])
def test_operation_errors_are_clear(make, message):
    with pytest.raises(SmallemError, match=message):
        make(Tape())


def test_backend_kernels_agree_with_reference_rules(backend):
    """Where a backend runs an operation with its own kernel, the rule here is the truth."""
    rng = np.random.default_rng(3)
    logits, targets = 4 * rng.normal(size=(32, 257)), rng.integers(0, 257, size=32)
    results = []
    for fused in (True, False):
        tape = Tape(backend, fused=fused)
        x = tape.leaf(logits)
        loss = tape.apply(CrossEntropy(targets), [x])
        results.append((backend.to_numpy(loss.value), backend.to_numpy(tape.backward(loss)[x])))
    tol = 1e-10 if backend.name == "cpu64" else 1e-5
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=tol)
    np.testing.assert_allclose(results[0][1], results[1][1], atol=tol)

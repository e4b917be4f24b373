"""The 2-2-1 ReLU network of the hand-computed lesson: the seed's numbers, from the tape."""

import numpy as np
import pytest

from smallem.models import toy


def test_forward_and_backward_match_the_hand_computation():
    r = toy.forward_backward()
    np.testing.assert_allclose(r.z1, [0.7, 1.0])
    np.testing.assert_allclose(r.a1, [0.7, 1.0])
    assert r.y_hat == pytest.approx(-0.15)
    assert r.loss == pytest.approx(0.66125)
    assert r.dy_hat == pytest.approx(-1.15)
    np.testing.assert_allclose(r.dW2, [-0.805, -1.15])
    np.testing.assert_allclose(r.da1, [-0.575, 0.575])
    np.testing.assert_allclose(r.dz1, [-0.575, 0.575])
    np.testing.assert_allclose(r.dW1, [[-0.575, -1.15], [0.575, 1.15]])
    assert r.dead == (False, False) and r.dead_count == 0


def test_one_step_at_0_1_more_than_halves_the_loss():
    records = toy.gradient_descent(0.1, steps=1)
    assert [r.step for r in records] == [0, 1]
    after = records[1]
    np.testing.assert_allclose(after.W2, [0.5805, -0.385])
    np.testing.assert_allclose(after.W1, [[0.1575, 0.415], [0.1425, 0.285]])
    assert after.y_hat == pytest.approx(0.2989, abs=1e-4)
    assert after.loss == pytest.approx(0.2457, abs=1e-4)


def test_at_0_5_both_hidden_units_die_in_three_steps():
    records = toy.gradient_descent(0.5, steps=20)
    assert len(records) == 21
    assert [r.dead_count for r in records[:4]] == [0, 1, 1, 2]
    assert toy.first_death(records) == [3, 1]  # h2 dies at step 1, h1 at step 3
    for r in records[3:]:
        assert r.dead == (True, True)
        assert r.loss == 0.5 and r.y_hat == 0.0
        assert not r.dW1.any() and not r.dW2.any()  # nothing can bring them back


def test_at_0_1_the_loss_falls_every_step():
    losses = [r.loss for r in toy.gradient_descent(0.1, steps=20)]
    assert all(b < a for a, b in zip(losses, losses[1:]))
    assert losses[-1] < 1e-10


def test_records_do_not_alias_the_seed_weights():
    toy.gradient_descent(0.5, steps=3)
    np.testing.assert_array_equal(toy.W1, [[0.1, 0.3], [0.2, 0.4]])
    np.testing.assert_array_equal(toy.W2, [0.5, -0.5])


def test_scan_finds_the_cliff_between_0_1_and_0_5():
    scan = toy.scan_learning_rates(np.logspace(-2, 0, 41))
    assert scan.final_loss.shape == scan.lrs.shape == scan.dead_count.shape
    assert np.all(scan.final_loss[scan.lrs >= 0.5] == 0.5)
    assert np.all(scan.dead_count[scan.lrs >= 0.5] == 2)
    assert np.all(scan.final_loss[scan.lrs < 0.45] < 0.2)
    assert 0.45 < scan.cliff <= 0.51


def test_find_cliff_bisects_the_edge():
    edge = toy.find_cliff(0.3, 0.6, tol=1e-3)
    assert 0.49 < edge < 0.5
    with pytest.raises(ValueError):
        toy.find_cliff(0.6, 0.9)


def test_cpu_float32_backend_gives_the_same_numbers():
    r = toy.forward_backward(backend="cpu")
    assert r.loss == pytest.approx(0.66125, rel=1e-6)
    np.testing.assert_allclose(r.dW1, [[-0.575, -1.15], [0.575, 1.15]], rtol=1e-6)

"""The reverse walk recorded one step at a time (stepthrough.py), checked against values worked
out here by hand or with plain NumPy, and against tape.backward bit for bit."""

import numpy as np
import pytest

from smallem import Tape, cross_entropy
from smallem.course.common.stepthrough import (
    STEP_CLASS,
    STEP_INFO_CLASS,
    BackwardWalk,
    StepThrough,
)
from smallem.models import toy


def a_times_b_plus_a(backend="cpu64"):
    tape = Tape(backend)
    a, b = tape.leaf(2.0), tape.leaf(3.0)
    c = a * b
    return tape, {"a": a, "b": b, "c": c, "loss": c + a}


def walk_of(build, backend="cpu64", key="loss"):
    tape, v = build(backend)
    return BackwardWalk(tape, v[key], names={var: k for k, var in v.items()}), v


def test_a_times_b_plus_a_step_by_step():
    walk, v = walk_of(a_times_b_plus_a)
    a, b, c, loss = (v[k].index for k in ("a", "b", "c", "loss"))
    assert [(s.index, s.op, s.inputs) for s in walk.steps] == [(loss, "add", (c, a)),
                                                               (c, "mul", (a, b))]
    add, mul = walk.steps
    assert float(walk.host(add.grad)) == 1.0
    assert [float(walk.host(x)) for x in add.contributions] == [1.0, 1.0]  # dc = 1, da = 1
    assert float(walk.host(mul.grad)) == 1.0
    assert [float(walk.host(x)) for x in mul.contributions] == [3.0, 2.0]  # 1·b, 1·a
    assert "da = dc·b" in mul.formula and not mul.fused
    # The state at each point: only the loss at the start, then the accumulations.
    assert [g is not None for g in walk.states[0]] == [False, False, False, True]
    assert float(walk.states[1][a]) == 1.0 and walk.states[1][b] is None
    assert float(walk.states[2][a]) == 4.0 and float(walk.states[2][b]) == 2.0
    # a, used twice, received two contributions: 1 at step 1, 3 at step 2.
    assert [(r.step, r.source, float(r.value)) for r in walk.received[a]] == [(1, loss, 1.0),
                                                                              (2, c, 3.0)]
    assert walk.tape.closed


@pytest.mark.parametrize("backend", ["cpu64", "cpu"])
def test_the_last_state_is_backward_bit_for_bit(backend):
    walk, _ = walk_of(a_times_b_plus_a, backend)
    twin, v = a_times_b_plus_a(backend)
    assert walk.equals(twin.backward(v["loss"]))
    other, w = a_times_b_plus_a(backend)  # a different computation must not compare equal
    assert not walk.equals(other.backward(w["c"]))


def stretched(backend="cpu64"):
    tape = Tape(backend)
    x = tape.constant(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    w = tape.leaf(np.array([0.5, -1.0, 2.0]))
    y = x * w
    return tape, {"x": x, "w": w, "y": y, "L": tape.sum(y + w)}


def test_broadcast_contributions_arrive_unbroadcast():
    walk, v = walk_of(stretched, key="L")
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    got = [r.value for r in walk.received[v["w"].index]]
    assert [g.shape for g in got] == [(3,), (3,)]
    np.testing.assert_array_equal(got[0], np.ones((2, 3)).sum(0))  # from the add
    np.testing.assert_array_equal(got[1], (np.ones((2, 3)) * x).sum(0))  # from the mul: g·x
    assert walk.gradient(v["x"].index) is None  # a constant receives nothing
    mul = walk.steps[-1]
    assert mul.op == "mul" and mul.contributions[0] is None  # ... and its slot says so
    twin, u = stretched()
    assert walk.equals(twin.backward(u["L"]))


def test_an_operation_with_its_own_rule_is_one_step():
    def build(backend="cpu64"):
        tape = Tape(backend)
        w = tape.leaf(np.array([[0.2, -0.1, 0.4], [0.3, 0.0, -0.2]]))
        h = tape.tanh(w)
        return tape, {"w": w, "h": h, "L": cross_entropy(tape, h, np.array([2, 0]))}

    walk, v = walk_of(build, key="L")
    assert [s.op for s in walk.steps] == ["cross_entropy", "tanh"]
    probs = np.exp(np.tanh(walk.values[0]))
    probs /= probs.sum(1, keepdims=True)
    expected = (probs - np.eye(3)[[2, 0]]) / 2  # (softmax − one-hot)/N
    np.testing.assert_allclose(walk.received[v["h"].index][0].value, expected, rtol=1e-12)
    twin, u = build()
    assert walk.equals(twin.backward(u["L"]))


def test_the_dead_network_stops_the_gradient_at_both_relus():
    fast = toy.gradient_descent(0.5, 3)
    W1, W2 = fast[3].W1, fast[3].W2
    tape, v = toy.record(W1, W2)
    walk = BackwardWalk(tape, v["L"])
    # Independently, in NumPy: both pre-activations negative, so nothing passes.
    z1 = W1 @ toy.X
    assert np.all(z1 < 0)
    y_hat = W2 @ np.maximum(z1, 0)
    da1 = (y_hat - toy.Y) * W2
    relu = next(s for s in walk.steps if s.op == "relu")
    np.testing.assert_allclose(walk.host(relu.grad).reshape(2), da1, rtol=1e-12)
    assert np.all(walk.host(relu.contributions[0]) == 0)
    assert not walk.gradient(v["W1"].index).any() and not walk.gradient(v["W2"].index).any()
    twin, u = toy.record(W1, W2)
    assert walk.equals(twin.backward(u["L"]))


def test_a_live_network_matches_a_numpy_backward():
    tape, v = toy.record()
    walk = BackwardWalk(tape, v["L"])
    z1 = toy.W1 @ toy.X
    a1 = np.maximum(z1, 0)
    dy = toy.W2 @ a1 - toy.Y
    dz1 = dy * toy.W2 * (z1 > 0)
    np.testing.assert_allclose(walk.gradient(v["W2"].index).reshape(2), dy * a1, rtol=1e-12)
    np.testing.assert_allclose(walk.gradient(v["W1"].index), np.outer(dz1, toy.X), rtol=1e-12)


def test_the_widget_moves_through_the_walk():
    walk, v = walk_of(a_times_b_plus_a)
    view = StepThrough(walk, point=0)
    assert STEP_CLASS in view._dom_classes
    assert view.prev.disabled and not view.next.disabled
    assert 'data-point="0"' in view.view.value and STEP_INFO_CLASS in view.view.value
    view.next.click()
    assert view.point == 1 and "incoming gradient 1" in view.view.value
    view.next.click()
    assert view.point == 2 and view.next.disabled
    a_row = f'data-index="{v["a"].index}" data-grad="4" data-terms="2"'
    assert a_row in view.view.value and "1 + 3 = 4" in view.view.value
    view.prev.click()
    assert f'data-index="{v["a"].index}" data-grad="1" data-terms="1"' in view.view.value


def test_a_stored_notebook_shows_the_end_state_not_a_repr():
    walk, _ = walk_of(a_times_b_plus_a)
    bundle = StepThrough(walk)._repr_mimebundle_()
    assert "StepThrough(" not in bundle["text/plain"] and "VBox(" not in bundle["text/plain"]
    assert "1 + 3 = 4" in bundle["text/plain"] and "<table>" in bundle["text/html"]


@pytest.mark.gpu
def test_a_gpu_tape_is_copied_to_the_host():
    from smallem import gpu_available

    if not gpu_available():
        pytest.skip("no CUDA device visible to CuPy")
    walk, v = walk_of(a_times_b_plus_a, "gpu")
    assert all(isinstance(x, np.ndarray) for x in walk.values)
    assert float(walk.gradient(v["a"].index)) == 4.0
    twin, u = a_times_b_plus_a("gpu")
    assert walk.equals(twin.backward(u["loss"]))

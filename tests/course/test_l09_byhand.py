"""Lesson 09's byhand.py: the comparison helper, the reference rules against the tape, scatter-add."""

from __future__ import annotations

import numpy as np
import pytest

from smallem import Tape, cross_entropy, gpu_available
from smallem.course.l09_backprop_by_hand import byhand
from smallem.course.l09_backprop_by_hand.byhand import compare
from smallem.models.mlp import Mlp, MlpConfig


def test_compare_verdicts():
    ref = np.array([[1.0, -2.0], [3.0, 0.5]])
    assert compare("a", ref.copy(), ref).verdict == "exact"
    approx = compare("a", ref + 1e-13, ref)
    assert approx.verdict == "rounding" and approx.ok and 0 < approx.max_diff < 1e-12
    wrong = compare("a", ref + np.array([[0, 0], [0.25, 0]]), ref)
    assert wrong.verdict == "wrong" and not wrong.ok and wrong.where == (1, 0)
    assert wrong.max_diff == pytest.approx(0.25)
    assert repr(wrong) == "a                ✗ off by 0.25 at [1, 0]"
    assert compare("a", ref.T[:1], ref).verdict == "wrong shape"
    assert compare("a", ..., ref).verdict == "not done"
    assert compare("a", None, ref).verdict == "not done"
    nan = ref.copy()
    nan[0, 1] = np.nan
    assert compare("a", nan, ref).verdict == "wrong"


def test_compare_tolerance_is_relative_to_the_reference():
    tiny = np.array([1e-20, -3e-20])
    assert compare("t", tiny * (1 + 1e-12), tiny).verdict == "rounding"
    assert compare("t", tiny * 2, tiny).verdict == "wrong"  # small numbers, wrong all the same


def test_compare_speaks_the_graders_words():
    """One vocabulary: "✓ exact", "✓ equal to float64 rounding", "✗ off by ..." here, and the same
    "off by" in an exercise grader's verdict."""
    from smallem.course import grade

    ref = np.array([0.1, 0.2, 0.3])
    assert repr(compare("x", ref.copy(), ref)) == "x                ✓ exact"
    rounding = repr(compare("x", ref * (1 + 1e-15), ref))
    assert rounding.startswith("x                ✓ equal to float64 rounding (largest difference")
    off = ref + np.array([0, 0.0216, 0])
    assert "✗ off by 0.0216 at [1]" in repr(compare("x", off, ref))
    verdict = grade("09.tanh_backward", lambda out, dout: dout * (1 - out))
    assert verdict.message.startswith("✗ ") and "(off by " in verdict.message
    assert "approximate" not in repr(compare("x", ref * (1 + 1e-15), ref))


def _mlp_and_batch():
    config = MlpConfig(context=4, embed=3, hidden=6, vocab=11)
    model = Mlp(config, backend="cpu64", seed=1)
    rng = np.random.default_rng(0)
    for p in model.parameters():  # larger weights: tanh off its straight middle
        p.value[...] = rng.normal(size=p.shape)
    X = np.array([[1, 2, 1, 1], [3, 1, 0, 2], [1, 1, 5, 1]])  # token 1 repeated on purpose
    return model, X, np.array([2, 7, 1])


def test_reference_rules_give_the_tapes_gradients_for_all_five_parameters():
    model, X, Y = _mlp_and_batch()
    tape = Tape("cpu64")
    grads = tape.backward(model.loss(tape, X, Y))
    table, W1, b1 = (p.value for p in (model.embedding.weight, model.hidden.weight, model.hidden.bias))
    W2, b2 = model.output.weight.value, model.output.bias.value
    flat = table[X].reshape(len(X), -1)
    h = np.tanh(flat @ W1 + b1)
    dh, dW2, db2 = byhand.linear_backward(h, W2, byhand.cross_entropy_grad(h @ W2 + b2, Y))
    dflat, dW1, db1 = byhand.linear_backward(flat, W1, byhand.tanh_backward(h, dh))
    dtable = byhand.embedding_backward(X, dflat.reshape(X.shape + (-1,)), 11)
    mine = [dtable, dW1, db1, dW2, db2]
    for (name, p), g in zip(model.named_parameters(), mine):
        assert compare(name, g, p.grad(grads)).ok, name


def test_cross_entropy_grad_is_the_seeds_example():
    g = byhand.cross_entropy_grad(np.log([[0.7, 0.1, 0.2]]), np.array([0]))
    assert np.allclose(g, [[-0.3, 0.1, 0.2]])
    tape = Tape("cpu64")
    z = tape.leaf(np.log([[0.7, 0.1, 0.2]]))
    assert np.allclose(tape.backward(cross_entropy(tape, z, [0]))[z], g)


def test_layer_norm_dx_matches_the_package_operation():
    from smallem import layer_norm
    rng = np.random.default_rng(2)
    x, dy = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    tape = Tape("cpu64")
    xv = tape.leaf(x)
    want = tape.backward(tape.sum(layer_norm(tape, xv, np.ones(5), np.zeros(5)) * dy))[xv]
    centered = x - x.mean(-1, keepdims=True)
    s = 1 / np.sqrt((centered**2).mean(-1, keepdims=True) + 1e-5)
    assert np.allclose(byhand.layer_norm_dx(centered * s, s, dy), want, atol=1e-12)


def test_lockstep_scatter_add_loses_every_repeat_like_numpys_buffered_add():
    rows = np.array([[4, 1, 4], [4, 0, 1]])
    values = np.arange(12, dtype=np.float64).reshape(2, 3, 2) + 1
    race = byhand.lockstep_scatter_add(rows, values, 6)
    buffered = np.zeros((6, 2))
    buffered[rows] += values
    assert np.array_equal(race, buffered)
    assert byhand.lost_updates(rows) == 3  # 4 three times (2 lost), 1 twice (1 lost)
    full = byhand.embedding_backward(rows, values, 6)
    assert np.allclose(full.sum(0), values.reshape(-1, 2).sum(0))  # nothing lost
    assert race.sum() < full.sum()


def test_no_recorded_gpu_numbers_are_invented():
    rec = byhand.RECORDED_SCATTER_RACE
    assert rec is None or (rec["atomic_exact"] and rec["plain_total"] < rec["expected_total"])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_gpu_atomic_scatter_add_keeps_every_repeat_and_plain_loses_some():
    rows = np.random.default_rng(0).integers(0, 8, size=(256, 16))  # 4,096 tokens into 8 rows
    atomic = byhand.gpu_scatter_add(rows, np.ones(rows.shape + (4,)), 8, atomic=True)
    assert np.array_equal(atomic, np.repeat(np.bincount(rows.ravel(), minlength=8)[:, None], 4, 1))
    race = byhand.scatter_add_race(rows, 8, width=4)
    assert race["atomic_exact"] and race["plain_total"] < race["expected_total"]

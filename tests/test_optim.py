"""SGD and AdamW against plain formulas written here, step by step; the first AdamW step is
the learning rate; decay only where marked; no update under an open tape; state by name;
clipping by the global norm and the norms it reads."""

import math

import numpy as np
import pytest

from smallem import SmallemError, Tape, get_backend
from smallem.nn import Parameter
from smallem.optim import SGD, AdamW, clip_by_global_norm, global_norm, gradient_norms, make_optimizer


def half_square_step(optimizer, params, backend):
    """loss = Σ ½p² over every parameter, so each gradient is the parameter itself."""
    tape = Tape(backend)
    loss = None
    for p in params:
        term = tape.sum(tape.mul(tape.square(p.var(tape)), 0.5))
        loss = term if loss is None else tape.add(loss, term)
    optimizer.step(params, tape.backward(loss))


def rel(backend):
    return 1e-12 if backend.name == "cpu64" else 1e-6


def test_sgd_three_steps(backend):
    p = Parameter(np.array([1.0, -2.0]), backend)
    opt = SGD(lr=0.1)
    expected = np.array([1.0, -2.0])
    for _ in range(3):
        half_square_step(opt, [p], backend)
        expected = expected - 0.1 * expected  # p ← p − lr·g with g = p
    np.testing.assert_allclose(p.numpy(), expected, rtol=rel(backend))
    assert p.numpy().tolist() == pytest.approx([0.729, -1.458], rel=1e-6)


@pytest.mark.parametrize("decay", [False, True])
def test_adamw_three_steps(backend, decay):
    lr, b1, b2, eps, wd = 0.1, 0.9, 0.999, 1e-8, 0.5
    p = Parameter(np.array([1.0, -3.0]), backend, decay=decay)
    opt = AdamW(lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    x, m, v = [1.0, -3.0], [0.0, 0.0], [0.0, 0.0]
    for t in (1, 2, 3):
        half_square_step(opt, [p], backend)
        for i in range(2):  # the textbook update, one number at a time
            g = x[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat, v_hat = m[i] / (1 - b1 ** t), v[i] / (1 - b2 ** t)
            x[i] = x[i] - lr * (m_hat / (math.sqrt(v_hat) + eps) + (wd * x[i] if decay else 0.0))
    np.testing.assert_allclose(p.numpy(), x, rtol=rel(backend))


@pytest.mark.parametrize("slope", [2.0, 200.0, -0.001])
def test_first_adamw_step_is_the_learning_rate(backend, slope):
    p = Parameter(np.array([0.5]), backend)
    tape = Tape(backend)
    opt = AdamW(lr=0.01, weight_decay=0.0)
    opt.step([p], tape.backward(tape.sum(tape.mul(p.var(tape), slope))))
    assert p.numpy()[0] == pytest.approx(0.5 - 0.01 * math.copysign(1, slope), rel=1e-6)


@pytest.mark.parametrize("first", [2, 3, 10])
def test_a_parameter_first_updated_late_moves_by_exactly_lr(backend, first):
    """Each parameter counts its own steps (as PyTorch does): one that first receives a
    gradient at the optimizer's step k is bias-corrected as at its own step 1. With one count
    for the optimizer it moved by 0.744·lr at k = 2 and 0.639·lr at k = 3."""
    early, late = Parameter(np.array([1.0]), backend), Parameter(np.array([0.5]), backend)
    opt = AdamW(lr=0.01, weight_decay=0.0)
    for k in range(1, first + 1):
        tape = Tape(backend)
        loss = tape.sum(tape.mul(early.var(tape), 3.0))
        if k == first:
            loss = tape.add(loss, tape.sum(tape.mul(late.var(tape), 200.0)))
        opt.step([early, late], tape.backward(loss))
    assert late.numpy()[0] == pytest.approx(0.5 - 0.01, rel=1e-6)
    assert opt.t[early] == first and opt.t[late] == 1
    state = opt.state_dict([("early", early), ("late", late)])
    assert state["meta"]["t"] == {"early": first, "late": 1}
    again = AdamW(lr=0.01, weight_decay=0.0)
    again.load_state_dict([("early", early), ("late", late)], state)
    assert again.t == opt.t


def test_an_update_never_silently_skips_a_parameter_read_by_a_newer_tape():
    """Bound on tape 1, differentiated there, then read by tape 2 before the update: the
    update either finds tape 1's gradient or refuses in one sentence (tape 2 still reads the
    value it would change); it used to skip the parameter with no word."""
    p = Parameter(np.array([1.0, 2.0]))
    one = Tape()
    grads = one.backward(one.sum(p.var(one)))
    two = Tape()
    p.var(two)
    with pytest.raises(SmallemError, match=f"still read by tape #{two.id}, which is open"):
        SGD(lr=0.1).step([p], grads)
    two.close()
    SGD(lr=0.1).step([p], grads)
    np.testing.assert_allclose(p.numpy(), [0.9, 1.9])


def test_decay_only_on_marked_parameters():
    """With a zero gradient, Adam's own step is zero; only the decay moves a parameter."""
    matrix, bias = Parameter(np.full((2, 2), 2.0), decay=True), Parameter(np.full(2, 2.0))
    tape = Tape("cpu64")
    loss = tape.add(tape.sum(tape.mul(matrix.var(tape), 0.0)), tape.sum(tape.mul(bias.var(tape), 0.0)))
    AdamW(lr=0.1, weight_decay=0.5).step([matrix, bias], tape.backward(loss))
    np.testing.assert_allclose(matrix.numpy(), 2.0 - 0.1 * 0.5 * 2.0)
    np.testing.assert_array_equal(bias.numpy(), 2.0)


def test_update_under_an_open_tape_is_an_error():
    p = Parameter(np.ones(2))
    reader = Tape()
    p.var(reader)  # read, never differentiated, still held
    tape = Tape()
    grads = tape.backward(tape.sum(p.var(tape)))
    with pytest.raises(SmallemError, match=f"tape #{reader.id}, which is open"):
        SGD(lr=0.1).step([p], grads)
    np.testing.assert_array_equal(p.numpy(), [1.0, 1.0])  # nothing was changed
    del reader
    SGD(lr=0.1).step([p], grads)  # once it is gone, the update goes through
    np.testing.assert_allclose(p.numpy(), [0.9, 0.9])


def test_gradients_of_a_tape_that_never_read_the_parameters():
    p = Parameter(np.ones(2))
    tape = Tape("cpu")
    grads = tape.backward(tape.sum(tape.leaf(np.ones(2))))
    with pytest.raises(SmallemError, match="none of these 1 parameters was read"):
        AdamW().step([p], grads)


def test_state_round_trip_continues_identically():
    def fresh():
        return [Parameter(np.array([1.0, -2.0]), "cpu", decay=True),
                Parameter(np.array([0.5]), "cpu")]

    a, b = fresh(), fresh()
    opt_a = AdamW(lr=0.05, weight_decay=0.1)
    for _ in range(3):
        half_square_step(opt_a, a, "cpu")
    named = [("w", a[0]), ("b", a[1])]
    state = opt_a.state_dict(named)
    assert sorted(state["tensors"]) == ["b.m", "b.v", "w.m", "w.v"] and state["meta"]["steps"] == 3
    for p, q in zip(b, a):
        p.assign(q.numpy())
    opt_b = AdamW(lr=0.05, weight_decay=0.1)
    opt_b.load_state_dict([("w", b[0]), ("b", b[1])], state)
    for _ in range(2):
        half_square_step(opt_a, a, "cpu")
        half_square_step(opt_b, b, "cpu")
    for p, q in zip(a, b):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_state_of_another_model_is_refused():
    p = Parameter(np.ones(2))
    opt = AdamW()
    half_square_step(opt, [p], "cpu64")
    state = opt.state_dict([("w", p)])
    with pytest.raises(SmallemError, match="'w', which the model does not have"):
        AdamW().load_state_dict([("v", Parameter(np.ones(2)))], state)
    with pytest.raises(SmallemError, match="shape \\[2\\], the parameter \\[3\\]"):
        AdamW().load_state_dict([("w", Parameter(np.ones(3)))], state)
    with pytest.raises(SmallemError, match="'adamw' optimizer state, not sgd"):
        SGD(0.1).load_state_dict([("w", p)], state)


@pytest.mark.parametrize("make", [lambda: SGD(lr=0), lambda: AdamW(lr=-1),
                                  lambda: AdamW(lr=float("nan")), lambda: AdamW(weight_decay=-0.1),
                                  lambda: make_optimizer("adam"), lambda: SGD(0.1, max_norm=0),
                                  lambda: AdamW(max_norm=-1.0)])
def test_bad_settings_are_clear_errors(make):
    with pytest.raises(SmallemError):
        make()


def test_sgd_clips_the_global_norm_before_the_step(backend):
    """Gradients [3, 4] and [12] (global norm 13) clipped to 6.5 are halved: one factor for all."""
    a, b = Parameter(np.array([3.0, 4.0]), backend), Parameter(np.array([12.0]), backend)
    opt = SGD(lr=0.1, max_norm=6.5)
    half_square_step(opt, [a, b], backend)  # gradient = the parameter itself
    assert opt.last_norm == pytest.approx(13.0, rel=1e-6)
    np.testing.assert_allclose(a.numpy(), [3.0 - 0.15, 4.0 - 0.2], rtol=rel(backend))
    np.testing.assert_allclose(b.numpy(), [12.0 - 0.6], rtol=rel(backend))


def test_adamw_moments_see_the_clipped_gradient(backend):
    p = Parameter(np.array([30.0, 40.0]), backend)  # gradient norm 50
    opt = AdamW(lr=0.01, weight_decay=0.0, max_norm=5.0)
    half_square_step(opt, [p], backend)
    m = np.asarray(backend.to_numpy(opt.m[p]))
    np.testing.assert_allclose(m, 0.1 * np.array([3.0, 4.0]), rtol=rel(backend))
    assert opt.last_norm == pytest.approx(50.0, rel=1e-6)


def test_no_clipping_unless_asked(backend):
    p = Parameter(np.array([300.0]), backend)
    opt = SGD(lr=0.1)
    half_square_step(opt, [p], backend)
    assert opt.last_norm is None and p.numpy()[0] == pytest.approx(270.0)


def host(backend, x):
    return np.asarray(backend.to_numpy(x), dtype=np.float64)


def test_norms(backend):
    g = [backend.tensor([3.0, 4.0]), None, backend.tensor([[12.0]])]
    assert global_norm(backend, g[:1]) == pytest.approx(5.0)
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

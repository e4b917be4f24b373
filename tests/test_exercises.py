"""Every exercise grader: it accepts its solution, rejects planted wrong answers with the right
sentence, calls a stub "not done yet", and reports a raising answer without a traceback."""

from __future__ import annotations

import math

import numpy as np
import pytest

from smallem.exercises import EXERCISES, ExerciseNotSolved, check, grade, show_solution, solution, use
from smallem.models import toy


def _raises(*args, **kwargs):
    raise ValueError("boom")


def _acc_replace(grads, index, grad):
    grads[index] = grad


def _acc_inplace(grads, index, grad):
    if grads[index] is None:
        grads[index] = grad
    else:
        grads[index] += grad


def _unbroadcast_left_only(grad, shape):
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    return grad


def _central_one_sided(f, x, eps=1e-5):
    grad = np.zeros_like(x)
    base = f(x)
    for i in np.ndindex(x.shape):
        saved = x[i]
        x[i] = saved + eps
        grad[i] = (f(x) - base) / eps
        x[i] = saved
    return grad


def _central_no_restore(f, x, eps=1e-5):
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        x[i] += eps
        up = f(x)
        x[i] -= 2 * eps
        grad[i] = (up - f(x)) / (2 * eps)
    return grad


def _adamw_l2(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    g = g + weight_decay * p  # Adam with L2: the decay goes through m and v
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return p - lr * (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps), m, v


def _adamw_uncorrected(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return p - lr * (m / (np.sqrt(v) + eps) + weight_decay * p), m, v


def _first_death_other_unit():  # solves for h1, whose dz1 is negative: a negative rate
    r = toy.forward_backward()
    return float(r.z1[0] / (r.dz1[0] * (r.x @ r.x)))


# id -> [(planted wrong answer, words the verdict must contain)]
PLANTED = {
    "01.two_paths": [((5.0, 2.0), "grad_a is 5 where the tape gives 7"),
                     ((7.0, 5.0), "grad_b is 5 where the tape gives 2")],
    "01.backward_221": [
        (lambda x, W1, W2, y: (np.outer((W2 @ np.maximum(W1 @ x, 0) - y) * W2, x),
                               (W2 @ np.maximum(W1 @ x, 0) - y) * np.maximum(W1 @ x, 0)),
         # no ReLU gate: wrong only where a unit is dead
         "dW1[0, 1] is −1.148 where the tape gives 0 (off by 1.15)"),
        (lambda x, W1, W2, y: (np.outer(x, (W2 @ np.maximum(W1 @ x, 0) - y) * W2 * (W1 @ x > 0)),
                               (W2 @ np.maximum(W1 @ x, 0) - y) * np.maximum(W1 @ x, 0)),
         "where the tape gives"),  # transposed outer product
    ],
    "02.exp_rule": [(lambda be, grad, out, a: (grad * a,),
                     "da[2] is 0.9312 where finite differences give 3.025"),
                    (lambda be, grad, out, a: grad * out, "returns a tuple with one gradient")],
    "02.div_rule": [(lambda be, grad, out, a, b: (grad / b, grad * a / b ** 2),
                     "db[1] is −1.203 where finite differences give 1.203"),  # sign flipped
                    (lambda be, grad, out, a, b: (grad / b, -grad / b ** 2), "finite differences give")],
    "02.accumulate": [(_acc_replace, "replaced the first instead of adding"),
                      (_acc_inplace, "also changed grads[1]")],
    "03.unbroadcast": [(lambda grad, shape: grad, "has shape [4, 3] where it should be [3]"),
                       (_unbroadcast_left_only, "where it should be [4, 1]")],
    "03.sum_rule": [(lambda be, grad, out, a, dim, keepdim: (np.broadcast_to(grad, a.shape),),
                     "raised ValueError"),  # the summed dimension not put back
                    (lambda be, grad, out, a, dim, keepdim: (np.ones_like(a),), "finite differences give")],
    "03.mean_rule": [(lambda be, grad, out, a, dim, keepdim:
                      (np.broadcast_to((grad if dim is None or keepdim else np.expand_dims(grad, dim))
                                       / a.size, a.shape),), "da[0, 1] is −0.1209"),  # n = a.size always
                     (lambda be, grad, out, a, dim, keepdim:
                      (np.broadcast_to(grad if dim is None or keepdim else np.expand_dims(grad, dim),
                                       a.shape),), "finite differences give")],  # no division
    "04.central_difference": [(_central_one_sided, "the tape's exact gradient is"),
                              (_central_no_restore, "left x changed"),
                              (lambda f, x, eps=1e-5: np.array([(f(x + eps) - f(x - eps)) / (2 * eps)]),
                               "has shape [1] where it should be [5]")],
    "04.relative_error": [(lambda a, n: float(np.max(np.abs(a - n) / np.maximum(np.abs(a), np.abs(n)))),
                           "two tiny gradients"),
                          (lambda a, n: float(np.max(np.abs(a - n))), "two large gradients")],
    "05.parameter_count": [(lambda c, e, h, v: v * e + c * e * h + h * v, "where the model holds 402,721"),
                           (lambda c, e, h, v: v * e + e * h + h + h * v + v, "hidden.weight 262,144")],
    "05.side_by_side": [(lambda table, ctx: table[ctx].reshape(-1, table.shape[1]),
                         "has shape [20, 3] where it should be [4, 15]"),
                        (lambda table, ctx: table[ctx].transpose(0, 2, 1).reshape(len(ctx), -1),
                         "where the model gives")],
    "05.linear_forward": [(lambda x, W, b: x @ W, "where smallem's Linear gives"),
                          (lambda x, W, b: x @ W.T + b, "raised ValueError")],
    "06.bias_correction": [(lambda m, v, t, b1, b2: (m, v),
                            "m_hat is m itself at step t = 1: after t steps from zero, m holds only "
                            "1 − β1ᵗ = 0.1 of the mean"),
                           (lambda m, v, t, b1, b2: (m / (1 - b1 ** (t - 1)), v / (1 - b2 ** (t - 1))),
                            "m_hat[0] is inf where m / (1 − β1ᵗ) gives 65.6105")],
    "06.adamw_step": [(_adamw_l2, "m[0, 0] is"),
                      (_adamw_uncorrected, "p[0, 1] is −0.7559 where the package's AdamW gives −0.7343")],
    "07.z1_after_step": [(lambda r, lr: r.z1 - lr * r.dz1, "where the network gives"),
                         (lambda r, lr: r.z1 + lr * r.dz1 * (r.x @ r.x), "z1 after the step[0] is")],
    "07.first_death_lr": [(0.5, "but smaller rates kill it too"), (0.2, "both units are still alive"),
                          (_first_death_other_unit(), "a learning rate is positive")],
    "08.sigmoid_grad": [(lambda x: 1 - (1 / (1 + np.exp(-x))) ** 2, "where the tape gives"),
                        (lambda x: np.exp(-x) / (1 + np.exp(-x)), "sigmoid_grad(x)[0] is 1")],
    "08.huber_grad": [(lambda r, delta=1.0: np.where(np.abs(r) <= delta, r, 0.0),
                       "huber_grad(r)[0] is 0 where the tape gives −1"),  # the DQN bug
                      (lambda r, delta=1.0: r, "huber_grad(r)[0] is −3")],
    "08.clip_by_global_norm": [
        (lambda grads, m: [g * min(1.0, m / np.linalg.norm(g)) for g in grads], "clip_by_global_norm gives"),
        (lambda grads, m: [np.clip(g, -m, m) for g in grads], "clip_by_global_norm gives"),
        (lambda grads, m: [g * m / np.sqrt(sum(np.sum(x * x) for x in grads)) for g in grads],
         # stretches gradients below the threshold
         "grads[0][2, 0] is 0.345 where smallem's clip_by_global_norm gives 0.2474 (off by 0.0977), "
         "on 3 gradients of global norm 0.717"),
    ],
}

LESSON_IDS = sorted(k for k in EXERCISES if k[:2] in {f"0{n}" for n in range(1, 9)})


def test_every_notebook_01_to_08_has_two_to_four_exercises_and_planted_answers():
    per_notebook = {f"0{n}": sum(k.startswith(f"0{n}.") for k in LESSON_IDS) for n in range(1, 9)}
    assert all(2 <= count <= 4 for count in per_notebook.values()), per_notebook
    assert len(LESSON_IDS) >= 20
    assert sorted(PLANTED) == LESSON_IDS  # a new exercise needs planted wrong answers here


@pytest.mark.parametrize("exercise_id", LESSON_IDS)
def test_solution_is_accepted(exercise_id, capsys):
    verdict = check(exercise_id, solution(exercise_id))
    assert verdict.ok and verdict.done and verdict.message.startswith(f"✓ {exercise_id} right")
    assert capsys.readouterr().out.strip() == verdict.message  # printed, one line


@pytest.mark.parametrize("exercise_id, k", [(i, k) for i in sorted(PLANTED) for k in range(len(PLANTED[i]))])
def test_planted_wrong_answer_is_rejected_with_the_right_message(exercise_id, k):
    wrong, words = PLANTED[exercise_id][k]
    verdict = grade(exercise_id, wrong)
    assert verdict.done and not verdict.ok, verdict.message
    assert words in verdict.message, verdict.message
    assert "Hint: " in verdict.message and "\n" not in verdict.message


def _stub_body(*args, **kwargs):
    ...


def _stub_raise(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("exercise_id", LESSON_IDS)
def test_unfinished_answers_are_not_done_yet(exercise_id):
    stubs = [..., None, (..., ...)]
    if callable(solution(exercise_id)):
        stubs += [_stub_body, _stub_raise, lambda *a, **k: (..., ...)]
    for stub in stubs:
        verdict = grade(exercise_id, stub)
        assert not verdict.done and not verdict.ok
        assert "not done yet" in verdict.message and f"show_solution('{exercise_id}')" in verdict.message


@pytest.mark.parametrize("exercise_id", LESSON_IDS)
def test_a_raising_answer_is_reported_in_one_sentence(exercise_id):
    verdict = grade(exercise_id, _raises)
    assert verdict.done and not verdict.ok
    # a function that raises, or (for a value exercise) a function where a value is wanted
    assert ("raised ValueError (boom)" in verdict.message or "should be" in verdict.message
            or "wants a function" not in verdict.message), verdict.message
    assert "Traceback" not in verdict.message and "\n" not in verdict.message


def test_function_exercises_report_the_error_and_its_input():
    verdict = grade("02.div_rule", _raises)
    assert "your div rule raised ValueError (boom) on a = [" in verdict.message


def test_expect_solved_raises_on_a_wrong_or_unfinished_answer(monkeypatch, capsys):
    monkeypatch.setenv("SMALLEM_EXPECT_SOLVED", "1")
    with pytest.raises(ExerciseNotSolved, match="not done yet"):
        check("02.exp_rule", ...)
    with pytest.raises(ExerciseNotSolved, match="da\\[2\\] is"):
        check("02.exp_rule", PLANTED["02.exp_rule"][0][0])
    assert check("02.exp_rule", solution("02.exp_rule")).ok


def test_use_returns_the_answer_when_right_and_the_reference_otherwise(capsys):
    right = solution("04.relative_error")
    assert use("04.relative_error", right) is right
    reference = use("04.relative_error", ...)
    assert reference(np.array([1.0]), np.array([1.5])) == 0.5 / 1.5
    assert "goes on with the package's reference" in capsys.readouterr().out


def test_value_exercise_reference_and_show_solution(capsys):
    assert math.isclose(solution("07.first_death_lr"), 1 / (0.575 * 5))
    assert solution("01.two_paths") == (7.0, 2.0)
    show_solution("02.div_rule")
    shown = capsys.readouterr().out
    assert shown == EXERCISES["02.div_rule"].solution_cell and "def div_rule(be, grad, out, a, b):" in shown


def test_unknown_exercise_is_one_clear_error():
    from smallem import SmallemError
    with pytest.raises(SmallemError, match="did you mean '02.div_rule'"):
        check("02.div_rul", None)

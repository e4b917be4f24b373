"""The grader's eight defects of issue 21, each pinned: sequences accepted everywhere, a missing
`return` named, every blank stub "not done yet" (read from every notebook's own exercise cells),
`use` handing on a float, "predict, then run" judged relatively and by meaning, verdicts with
enough digits, bias correction graded per moment, and AdamW's ε placement said."""

from __future__ import annotations

import re

import numpy as np
import pytest
from course import exercise_ids, run_cell, stubs

from smallem.course import grade, reveal, solution, use

STUBS = stubs()  # every notebook's exercise cells, as shipped
LESSON_IDS = exercise_ids()


def _stub_answer(exercise_id: str):
    return run_cell(exercise_id, STUBS[exercise_id])


# 1 · a pair or triple as any sequence ----------------------------------------------------

@pytest.mark.parametrize("exercise_id", LESSON_IDS)
def test_a_list_is_accepted_wherever_a_tuple_is(exercise_id):
    right = solution(exercise_id)
    if isinstance(right, tuple):
        assert grade(exercise_id, list(right)).ok
        assert grade(exercise_id, np.array(right)).ok
    elif callable(right) and exercise_id != "02.accumulate":
        probe = grade(exercise_id, right)
        assert probe.ok

        def as_list(*args, **kwargs):
            out = right(*args, **kwargs)
            return list(out) if isinstance(out, tuple) else out

        verdict = grade(exercise_id, as_list)
        assert verdict.ok, verdict.message


# 2 · a function that returns None --------------------------------------------------------

@pytest.mark.parametrize("exercise_id", [i for i in LESSON_IDS if callable(solution(i))
                                         and i != "02.accumulate"])
def test_a_function_that_returns_none_is_told_so(exercise_id):
    def forgot(*args, **kwargs):
        result = args[0]  # computed, never returned  # noqa: F841

    verdict = grade(exercise_id, forgot)
    assert verdict.done and not verdict.ok
    assert "returned None (forgot `return`?)" in verdict.message, verdict.message


def test_accumulate_that_stores_nothing_says_the_slot_is_still_none():
    def accumulate(grads, index, grad):
        total = grad if grads[index] is None else grads[index] + grad  # noqa: F841

    verdict = grade("02.accumulate", accumulate)
    assert verdict.done and "`grads[index]` is still None" in verdict.message, verdict.message


# 3 · every blank stub, as the notebooks ship it, is "not done yet" ------------------------

def test_every_exercise_has_its_cell():
    assert sorted(STUBS) == LESSON_IDS


@pytest.mark.parametrize("exercise_id", LESSON_IDS)
def test_the_notebook_stub_is_not_done_yet_and_offers_the_hint_first(exercise_id):
    verdict = grade(exercise_id, _stub_answer(exercise_id))
    assert not verdict.done and not verdict.ok, verdict.message
    message = verdict.message
    assert "not done yet" in message
    assert f"hint('{exercise_id}')" in message and f"show_solution('{exercise_id}')" in message
    assert message.index("hint(") < message.index("show_solution(")


def test_adamw_stub_returning_its_inputs_is_not_done():
    def adamw_step(p, g, m, v, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
        ...
        return p, m, v

    assert not grade("06.adamw_step", adamw_step).done


# 4 · use hands on a float, or refuses --------------------------------------------------------

def test_use_hands_on_a_float_for_a_one_element_array(capsys):
    right = solution("07.first_death_lr")
    handed = use("07.first_death_lr", np.array([right]))
    assert type(handed) is float and handed == right


def test_use_refuses_a_string_in_a_sentence(capsys):
    verdict = grade("07.first_death_lr", str(solution("07.first_death_lr")))
    assert verdict.done and not verdict.ok and "a number" in verdict.message
    handed = use("07.first_death_lr", "0.6957")
    assert type(handed) is float  # the reference, which the next cell can use
    assert not grade("07.first_death_lr", True).ok


# 5 · predict, then run -------------------------------------------------------------------

@pytest.mark.parametrize("guess, measured, kwargs, verdict", [
    (1e-11, 0.004214, {"factor": 10}, "Read on"),
    ((0, 0), (0.001, 0.001), {}, "Read on"),
    (0.0, 0.004, {}, "Read on"),
    (0.0042, 0.004214, {"factor": 10}, "Well predicted"),
    (0.004, 0.004214, {"factor": 10}, "Right order of magnitude"),
    (0.001, 0.004214, {"factor": 10}, "Right order of magnitude"),
    ((0.001, 0.001), (0.001, 0.001), {}, "Well predicted"),
    ([0.001, 0.00102], (0.001, 0.001), {}, "Well predicted"),
    (0.25, 0.2457, {}, "Well predicted"),
    (0.3, 0.2457, {}, "Read on"),
    (1, 1, {}, "Well predicted"),
    (2, 1, {}, "Read on"),
    ("False", False, {}, "Well predicted"),
    ("no", False, {}, "Well predicted"),
    ("true", False, {}, "Read on"),
    (False, False, {}, "Well predicted"),
    ("Grow", "grow", {}, "Well predicted"),
    (" grow ", "grow", {}, "Well predicted"),
    (True, "grow", {}, "Read on"),
    ("shrink", "grow", {}, "Read on"),
    ("(4, 3)", (4, 3), {}, "Well predicted"),
    ("[4, 3]", (4, 3), {}, "Well predicted"),
    ("4 x 3", (4, 3), {}, "Well predicted"),
    ([4, 3], (4, 3), {}, "Well predicted"),
    ("(3,)", (4, 3), {}, "Read on"),
    ((3,), (4, 3), {}, "Read on"),
    ("0.2", 0.2, {}, "Well predicted"),
])
def test_reveal_judges_by_meaning_and_relatively(guess, measured, kwargs, verdict, capsys):
    reveal(guess, measured, "it", **kwargs)
    out = capsys.readouterr().out
    assert verdict in out and out.count("\n") == 1, out


# 6 · enough digits to see the difference ------------------------------------------------

def test_a_verdict_shows_digits_that_differ():
    right = solution("06.adamw_step")

    def nearly(*args):
        p, m, v = right(*args)
        return p + 1e-5, m, v

    message = grade("06.adamw_step", nearly).message
    got, want = re.search(r"is (\S+) where .*? gives (\S+) \(", message).groups()
    assert got != want, message


# 7 · m̂ and v̂ each -----------------------------------------------------------------------

def test_bias_correction_grades_m_hat_and_v_hat_each():
    ratio_only = lambda m, v, t, b1=0.9, b2=0.999: (m, v * (1 - b1**t) ** 2 / (1 - b2**t))  # noqa: E731
    verdict = grade("06.bias_correction", ratio_only)
    assert not verdict.ok and "m_hat" in verdict.message and "v_hat" not in verdict.message.split("Hint")[0]
    only_m = lambda m, v, t, b1=0.9, b2=0.999: (m / (1 - b1**t), v)  # noqa: E731
    verdict = grade("06.bias_correction", only_m)
    assert not verdict.ok and "v_hat" in verdict.message.split("Hint")[0], verdict.message


# 8 · where ε goes ------------------------------------------------------------------------

def _adamw_efficient(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    step = lr * np.sqrt(1 - beta2**t) / (1 - beta1**t)  # the Adam paper's "efficient" form
    return p - step * m / (np.sqrt(v) + eps) - lr * weight_decay * p, m, v


def test_adamw_wrong_epsilon_is_named():
    verdict = grade("06.adamw_step", _adamw_efficient)
    said = verdict.message.split("Hint")[0]
    assert not verdict.ok and "m̂/(√v̂ + ε)" in said and "faster form" in said, verdict.message

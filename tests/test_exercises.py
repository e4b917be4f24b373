"""Every exercise grader, of every lesson the registry holds: it accepts its solution, rejects
each planted mistake (registered beside it, `mistakes=`) with the right sentence, calls a stub
"not done yet", and reports a raising answer without a traceback."""

from __future__ import annotations

import math

import numpy as np
import pytest
from course import exercise_ids, lessons, planted

from smallem.course import EXERCISES, ExerciseNotSolved, check, grade, show_solution, solution, use


def _raises(*args, **kwargs):
    raise ValueError("boom")


def test_every_lesson_has_two_to_five_exercises_each_with_planted_mistakes():
    per_lesson = {lesson: len(ids) for lesson, ids in lessons().items()}
    assert len(per_lesson) >= 11 and all(2 <= n <= 5 for n in per_lesson.values()), per_lesson
    few = [i for i in exercise_ids() if len(EXERCISES[i].mistakes) < 2]
    assert not few, f"these exercises need 2 or more planted mistakes (`mistakes=` in @exercise): {few}"
    for i in exercise_ids():
        assert all(isinstance(words, str) and words for _, words in EXERCISES[i].mistakes.values()), i


@pytest.mark.parametrize("exercise_id", exercise_ids())
def test_solution_is_accepted(exercise_id, capsys):
    verdict = check(exercise_id, solution(exercise_id))
    assert verdict.ok and verdict.done and verdict.message.startswith(f"✓ {exercise_id} right")
    assert capsys.readouterr().out.strip() == verdict.message  # printed, one line


@pytest.mark.parametrize("exercise_id, mistake", planted())
def test_planted_mistake_is_rejected_with_the_right_message(exercise_id, mistake):
    wrong, words = EXERCISES[exercise_id].mistakes[mistake]
    with np.errstate(all="ignore"):
        verdict = grade(exercise_id, wrong)
    assert verdict.done and not verdict.ok, verdict.message
    assert words in verdict.message, verdict.message
    assert "Hint: " in verdict.message and "\n" not in verdict.message and "Traceback" not in verdict.message


def _stub_body(*args, **kwargs):
    ...


def _stub_raise(*args, **kwargs):
    raise NotImplementedError


def _shaped_like(right, stub):
    """`stub` where the solution holds a function (a pair of functions gets two)."""
    if isinstance(right, tuple) and all(callable(f) for f in right):
        return tuple(stub for _ in right)
    return stub


@pytest.mark.parametrize("exercise_id", exercise_ids())
def test_unfinished_answers_are_not_done_yet(exercise_id):
    right = solution(exercise_id)
    stubs = [..., None, (..., ...)]
    if callable(right) or isinstance(right, tuple) and all(callable(f) for f in right):
        stubs += [_shaped_like(right, s) for s in (_stub_body, _stub_raise, lambda *a, **k: (..., ...))]
    for stub in stubs:
        verdict = grade(exercise_id, stub)
        assert not verdict.done and not verdict.ok
        assert "not done yet" in verdict.message and f"show_solution('{exercise_id}')" in verdict.message


@pytest.mark.parametrize("exercise_id", exercise_ids())
def test_a_raising_answer_is_reported_in_one_sentence(exercise_id):
    verdict = grade(exercise_id, _shaped_like(solution(exercise_id), _raises))
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
        check("02.exp_rule", EXERCISES["02.exp_rule"].mistakes["the input for the output"][0])
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

"""Issue 35's predictions judged by content (`reveal`): right answers in the forms a learner writes
them are right, and the question "which of two neighbours" is judged exactly (written to fail
before the fix)."""

from __future__ import annotations

import pytest
from smallem.exercises import reveal


def _judged(capsys, *args, **kwargs) -> str:
    reveal(*args, **kwargs)
    return capsys.readouterr().out


@pytest.mark.parametrize("guess", [1.0078125, 1.00390625, 1.004])
def test_the_other_neighbour_of_a_tie_is_not_well_predicted(capsys, guess):
    out = _judged(capsys, guess, 1.0, "1 + 2⁻⁸ in bf16", exact=True)
    assert "Read on" in out and "Well predicted" not in out, out


def test_the_right_neighbour_is_exactly_right(capsys):
    assert "Exactly" in _judged(capsys, "1", 1.0, "1 + 2⁻⁸ in bf16", exact=True)


@pytest.mark.parametrize("guess, measured", [(50, 0.5076), ("50%", 0.5076), (0.5, 0.5076),
                                             (0.6, 60), ("60%", 60), (60, 60)])
def test_a_fraction_and_a_percentage_of_the_same_share_are_both_right(capsys, guess, measured):
    out = _judged(capsys, guess, measured, "the share", share=True)
    assert "Well predicted" in out, out
    if (guess, measured) in ((50, 0.5076), ("50%", 0.5076), (0.6, 60)):  # the other form: said so
        assert "same share" in out, out


@pytest.mark.parametrize("guess", ["float16", ["fp16"], "fp16, no loss scale", "FP16", "half"])
def test_the_lessons_own_names_for_fp16_are_fp16(capsys, guess):
    assert "Well predicted" in _judged(capsys, guess, "fp16", "the run with the highest loss")


def test_another_run_named_with_fp16_in_it_is_not_fp16(capsys):
    assert "Read on" in _judged(capsys, "fp16 + scaler", "fp16", "the run with the highest loss")
    assert "Read on" in _judged(capsys, "fp32", "fp16", "the run with the highest loss")


@pytest.mark.parametrize("guess", ["no.", False, "No", "no"])
def test_no_in_any_form_is_no(capsys, guess):
    assert "Well predicted" in _judged(capsys, guess, "no", "the answer")


def test_a_leading_number_followed_by_words_is_that_number(capsys):
    assert "Well predicted" in _judged(capsys, "1.0 (it never moves)", 1.0, "w after 100 steps")
    assert "Read on" in _judged(capsys, "0.9 (it moves)", 1.0, "w after 100 steps")


def test_a_ratio_said_with_its_unit_is_that_number(capsys):
    """Lesson 15 asks how many times faster: "9x", "9 ×" and "12 times faster" are numbers
    (a ratio's unit), while "9xx", "x9" and "1/9" stay unread."""
    for guess, verdict in (("9x", "Well predicted."), ("9 ×", "Well predicted."),
                           ("12 times faster", "Right order of magnitude."),
                           ("9xx", "Read on to see why."), ("x9", "Read on to see why."),
                           ("1/9", "Read on to see why.")):
        reveal(guess, 9.1, "the speed-up", factor=2)
        assert capsys.readouterr().out.rstrip().endswith(verdict), guess

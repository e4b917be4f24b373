"""hint(ID): every registered exercise has two or three hints, given one at a time, from a
nudge to nearly the answer, then show_solution; an unknown ID is one sentence saying how IDs look."""

from __future__ import annotations

import pytest
from course import exercise_ids

from smallem import SmallemError
from smallem.course import EXERCISES, grade, hint, show_solution
from smallem.course.common.grading import _hints_given


@pytest.mark.parametrize("eid", exercise_ids())
def test_every_exercise_has_two_or_three_hints(eid):
    hints = EXERCISES[eid].hints
    assert 2 <= len(hints) <= 3
    assert len(set(hints)) == len(hints) and all(h.strip().endswith((".", ")", "?")) for h in hints)
    assert all(len(h) >= 40 and "\n" not in h for h in hints)


def test_hints_come_one_at_a_time_then_the_solution(capsys):
    _hints_given.pop("02.exp_rule", None)
    count = len(EXERCISES["02.exp_rule"].hints)
    for k in range(1, count + 1):
        hint("02.exp_rule")
        out = capsys.readouterr().out
        assert out.startswith(f"Hint {k} of {count} for 02.exp_rule: ") and out.count("\n") == 1
        assert EXERCISES["02.exp_rule"].hints[k - 1] in out
        assert ("show_solution('02.exp_rule') is next" in out) == (k == count)
    hint("02.exp_rule")
    assert "last hint" in capsys.readouterr().out
    hint("02.exp_rule", 1)  # any one again, by its number
    assert capsys.readouterr().out.startswith("Hint 1 of")


def test_a_wrong_hint_number_or_an_unknown_id_is_one_sentence(capsys):
    with pytest.raises(SmallemError, match="hints 1 to"):
        hint("02.exp_rule", 9)
    hint("exp_rule")  # an unknown id: printed in one sentence, no traceback in a notebook
    out = capsys.readouterr().out
    assert "as in '02.exp_rule'" in out and out.count("\n") == 1
    hint("11.softmax")
    assert "did you mean '11.softmax_backward'" in capsys.readouterr().out
    show_solution("02.div_rul")
    assert "did you mean '02.div_rule'" in capsys.readouterr().out


def test_a_wrong_answer_shows_the_first_hint_and_offers_more():
    verdict = grade("02.exp_rule", lambda be, grad, out, a: (grad * a,))
    assert EXERCISES["02.exp_rule"].hints[0] in verdict.message
    assert "hint('02.exp_rule') gives more" in verdict.message


@pytest.mark.parametrize("eid", ["02.exp_rule", "11.causal_mask", "16.merge_rule"])
def test_after_a_wrong_verdict_hint_gives_the_next_hint_not_the_one_shown(capsys, eid):
    from smallem.course import check

    _hints_given.pop(eid, None)
    verdict = check(eid, 12345)  # a wrong answer: the verdict shows hint 1
    shown = capsys.readouterr().out
    assert not verdict.ok and EXERCISES[eid].hints[0] in shown and "gives more" in shown
    hint(eid)
    out = capsys.readouterr().out
    count = len(EXERCISES[eid].hints)
    assert out.startswith(f"Hint 2 of {count} for {eid}: ") and EXERCISES[eid].hints[1] in out, out


@pytest.mark.parametrize("answer, says", [
    ((1, 2, 3), "is a tuple of 3 values, where 16.merge_rule wants 2: (count_pairs, merge)"),
    ("abc", "is a str, where 16.merge_rule wants 2 values: (count_pairs, merge)"),
    (10 ** 400, "a whole number of 401 digits, past the largest float (about 1.8e308)"),
])
def test_an_answer_of_the_wrong_shape_or_size_is_named_in_one_sentence(capsys, answer, says):
    from smallem.course import check

    verdict = check("16.merge_rule", answer)
    out = capsys.readouterr().out
    assert not verdict.ok and out.count("\n") == 1 and says in out, out
    assert "ValueError" not in out and "OverflowError" not in out and "could not be graded" not in out


def test_a_huge_number_inside_an_answer_is_named_too(capsys):
    from smallem.course import check

    check("02.exp_rule", [1.0, 10 ** 400])
    out = capsys.readouterr().out
    assert "401 digits" in out and "OverflowError" not in out, out

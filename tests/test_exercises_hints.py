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

"""The exercise framework: a registry of graders, and the verdicts they print.

A lesson's exercises.py (course/l01_chain_rule/exercises.py, ...) registers each exercise with
`@exercise`: its grader, the cell a learner would write (`solution_cell`, which is also the
reference: executing it gives `solution(id)`), its hints, from a nudge to nearly the answer, and
its planted `mistakes` (wrong answers the tests feed the grader, each with words its verdict must
say). Graders raise `Wrong("...")` (graders.py: the tools they grade with) with the one sentence
that locates the mistake; `check` turns that into a Verdict, prints it and records it
(progress.py). Nothing a learner writes can make `check` show a traceback.
"""

from __future__ import annotations

import difflib
import math
import os
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import SmallemError
from . import progress as _progress
from .graders import NotDone, Wrong, _error, blank, holds_itself, unfinished
from .predict import reveal  # noqa: F401  (reveal: the face of predict.py)

EXPECT_SOLVED = "SMALLEM_EXPECT_SOLVED"  # =1: check raises on any answer that is not right


class ExerciseNotSolved(SmallemError):
    """Raised by `check` under SMALLEM_EXPECT_SOLVED=1 when an answer is not right."""


@dataclass(frozen=True)
class Verdict:
    """What `check` found: `ok` (right), `done` (not a stub), and the sentence it printed."""
    id: str
    ok: bool
    done: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def _ipython_display_(self) -> None:
        """`check` already printed the sentence: a notebook shows nothing more."""

    def __str__(self) -> str:
        return self.message


@dataclass
class Exercise:
    id: str
    title: str
    hints: tuple[str, ...]  # from a nudge to nearly the answer; a ✗ verdict shows the first
    grade: Callable[[Any], str | None]  # raises Wrong/NotDone, or returns a detail for "right"
    solution_cell: str  # the filled-in exercise cell, exactly as a learner would write it
    answer: str | tuple[str, ...]  # the name(s) the cell defines: what check() receives
    env: dict[str, Any]  # the notebook's names that the cell uses (np and math are always in)
    hand_on: Callable[[Any], Any] | None = field(default=None)  # what `use` passes on, when right
    # planted wrong answers: name -> (answer, words its verdict must contain); the tests grade each
    mistakes: dict[str, tuple[Any, str]] = field(default_factory=dict)
    alternate_cell: str = ""  # a second right answer in another style: the tests run the notebook on it too
    # words of a ✗ sentence -> the hint about that part (1-based); a ✗ naming none of them appends hint 1
    hint_for: dict[str, int] = field(default_factory=dict)

    def hint_about(self, sentence: str) -> int:
        """The number of the hint about the part a ✗ sentence names (1 when it names none)."""
        return next((k for words, k in self.hint_for.items() if words in sentence), 1)

    def solution(self, cell: str | None = None) -> Any:  # or what another cell (the alternate) defines
        namespace = {"np": np, "math": math, **self.env}
        exec(compile(cell or self.solution_cell, f"<solution {self.id}>", "exec"), namespace)  # noqa: S102
        if isinstance(self.answer, tuple):
            return tuple(namespace[name] for name in self.answer)
        return namespace[self.answer]


EXERCISES: dict[str, Exercise] = {}


def exercise(id: str, *, title: str, hints: Sequence[str], solution_cell: str,
             answer: str | tuple[str, ...], env: dict[str, Any] | None = None,
             hand_on: Callable[[Any], Any] | None = None,
             mistakes: Mapping[str, tuple[Any, str]] | None = None, alternate_cell: str = "",
             hint_for: Mapping[str, int] | None = None) -> Callable:
    """Register the decorated grader `grade(answer)` as exercise `id` ("04.central_difference"),
    with 2 or 3 `hints`, from a nudge to nearly the answer, and its planted `mistakes`
    ({name: (wrong answer, words the verdict must contain)}, which the tests feed it), and
    `hint_for` ({words of a ✗ sentence: the number of the hint about that part})."""

    def register(grade: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        if id in EXERCISES:
            raise SmallemError(f"exercise {id!r} is registered twice")
        if not 2 <= len(hints) <= 3:
            raise SmallemError(f"exercise {id!r} needs 2 or 3 hints, got {len(hints)}")
        if any(not 1 <= k <= len(hints) for k in (hint_for or {}).values()):
            raise SmallemError(f"exercise {id!r}: hint_for names a hint it does not have")
        EXERCISES[id] = Exercise(id, title, tuple(hints), grade,
                                 textwrap.dedent(solution_cell).strip() + "\n", answer,
                                 dict(env or {}), hand_on, dict(mistakes or {}), alternate_cell.strip(),
                                 dict(hint_for or {}))
        return grade

    return register


def _get(exercise_id: Any) -> Exercise:
    if not isinstance(exercise_id, str) or exercise_id not in EXERCISES:
        close = difflib.get_close_matches(str(exercise_id), EXERCISES, n=1)
        raise SmallemError(f"there is no exercise {exercise_id!r}: an exercise is named by its lesson "
                           "and a name, as in '02.exp_rule' (the first line of its cell says it)"
                           + (f"; did you mean {close[0]!r}?" if close else "."))
    return EXERCISES[exercise_id]


_hints_given: dict[str, int] = {}  # how many hints each exercise has shown in this kernel


def hint(exercise_id: str, number: int | None = None) -> None:
    """Print the exercise's next hint (or hint `number`, from 1); after the last, say that
    `show_solution` is next."""
    try:
        ex = _get(exercise_id)
    except SmallemError as error:  # a notebook shows the sentence, not a traceback
        print(error)
        return
    count = len(ex.hints)
    if number is None:
        number = _hints_given.get(ex.id, 0) + 1
    elif not (isinstance(number, int) and 1 <= number <= count):
        raise SmallemError(f"{ex.id} has hints 1 to {count}, not {number!r}")
    if number > count:
        print(f"That was the last hint for {ex.id}; show_solution('{ex.id}') shows one solution.")
        return
    _hints_given[ex.id] = max(_hints_given.get(ex.id, 0), number)
    after = (f"hint('{ex.id}') again gives the next one." if number < count else
             f"That was the last hint: show_solution('{ex.id}') is next.")
    print(f"Hint {number} of {count} for {ex.id}: {ex.hints[number - 1]} {after}")


def grade(exercise_id: str, answer: Any) -> Verdict:
    """The verdict on `answer`, without printing it."""
    ex = _get(exercise_id)
    not_done = (f"{ex.id} is not done yet: fill in the exercise cell and run it, then run this "
                f"cell again. Stuck? hint('{ex.id}') gives a first hint, and "
                f"show_solution('{ex.id}') shows one solution.")
    more = f"Hint: {ex.hints[0]} (hint('{ex.id}') gives more.)"
    if holds_itself(answer):
        return Verdict(ex.id, False, True, f"✗ {ex.id}: your answer holds itself (a list, tuple or "
                                           f"dict inside itself), so it cannot be graded; give the values "
                                           f"themselves. {more}")
    if unfinished(answer) or blank(answer):
        return Verdict(ex.id, False, False, not_done)
    try:
        detail = ex.grade(answer)
    except NotDone:
        return Verdict(ex.id, False, False, not_done)
    except Wrong as wrong:
        k = ex.hint_about(str(wrong))  # the hint about the part that is wrong
        if k > 1:
            more = (f"Hint: {ex.hints[k - 1]} (that is hint {k} of {len(ex.hints)}; hint('{ex.id}') gives "
                    "them in order.)")
        return Verdict(ex.id, False, True, f"✗ {ex.id} not right yet: {wrong} {more}")
    except Exception as error:  # noqa: BLE001  (an answer of an unexpected kind: say so, calmly)
        fault = _size_fault(answer) or _shape_fault(ex, answer)
        if fault:  # what the grader tripped on (unpacking, a float), named instead of its error
            return Verdict(ex.id, False, True, f"✗ {ex.id} not right yet: your answer {fault}. {more}")
        return Verdict(ex.id, False, True, f"✗ {ex.id}: your answer could not be graded, "
                                           f"{_error(error)}. {more}")
    return Verdict(ex.id, True, True, f"✓ {ex.id} right: {detail or ex.title}.")


def _shape_fault(ex: Exercise, answer: Any) -> str | None:
    """An exercise whose cell defines several names takes them together, in order: anything
    else, named (a grader unpacking it said "ValueError: too many values to unpack")."""
    if not isinstance(ex.answer, tuple):
        return None
    wants = f"{len(ex.answer)} values: ({', '.join(ex.answer)})"
    kind = type(answer).__name__
    kind = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
    if not isinstance(answer, (tuple, list)):
        return f"is {kind}, where {ex.id} wants {wants}, in that order"
    if len(answer) != len(ex.answer):
        return (f"is {kind} of {len(answer)} values, where {ex.id} wants "
                f"{len(ex.answer)}: ({', '.join(ex.answer)}), in that order")
    return None


def _size_fault(answer: Any, depth: int = 0) -> str | None:
    """A whole number past the largest float, anywhere in the answer (a grader's arithmetic
    said "OverflowError: int too large to convert to float")."""
    if isinstance(answer, int) and not isinstance(answer, bool) and abs(answer) > _LARGEST:
        digits = len(str(abs(answer))) if abs(answer) < 10 ** 4000 else "thousands of"
        return (f"holds a whole number of {digits} digits, past the largest float (about 1.8e308), "
                "which no computation here can hold: give a number in range")
    if depth < 4 and isinstance(answer, (list, tuple, dict)):
        items = answer.values() if isinstance(answer, dict) else answer
        for item in list(items)[:10_000]:
            fault = _size_fault(item, depth + 1)
            if fault:
                return fault
    return None


_LARGEST = float(np.finfo(np.float64).max)


def check(exercise_id: str, answer: Any) -> Verdict:
    """Grade `answer`, print the one-sentence verdict, and return it. Under
    SMALLEM_EXPECT_SOLVED=1, an answer that is not right raises ExerciseNotSolved."""
    verdict = grade(exercise_id, answer)
    print(verdict.message)
    if verdict.done and not verdict.ok:  # its message showed hint 1: hint() gives the next one
        _hints_given[verdict.id] = max(_hints_given.get(verdict.id, 0), 1)
    if verdict.done:  # a verdict earned is kept (with the answer's source when right); a stub is not
        hand_on = _get(exercise_id).hand_on  # a value is kept as the lesson uses it (a float, not [0.35])
        kept = (hand_on(answer) if hand_on else answer) if verdict.ok else None
        _progress.record(verdict.id, verdict.ok, _progress.source_of(kept) if verdict.ok else None)
    if os.environ.get(EXPECT_SOLVED) == "1" and not verdict.ok:
        raise ExerciseNotSolved(verdict.message)
    return verdict


def use(exercise_id: str, answer: Any) -> Any:
    """`answer` when it is right, otherwise the package's reference, so the lesson goes on."""
    if check(exercise_id, answer).ok:
        hand_on = _get(exercise_id).hand_on
        return hand_on(answer) if hand_on else answer
    print("  The lesson goes on with the package's reference answer.")
    return solution(exercise_id)


def progress() -> _progress.Progress:
    """Each lesson's exercises, passed (✓), tried (✗) or to do (·), and where that is kept."""
    return _progress.table(list(EXERCISES))


def solution(exercise_id: str) -> Any:
    """The reference answer of an exercise: what its solution cell defines."""
    return _get(exercise_id).solution()


def show_solution(exercise_id: str) -> None:
    """Print the filled-in exercise cell (after `hint`, when the hints were not enough)."""
    try:
        print(_get(exercise_id).solution_cell, end="")
    except SmallemError as error:  # a notebook shows the sentence, not a traceback
        print(error)

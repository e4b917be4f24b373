"""Lessons are found, not listed: a throwaway lesson 99 (a lesson folder, l99_doubling/ with its
exercises.py and a recorded result, and a notebook, written to a temporary folder) is registered
by the package's own loader and reaches every shared test (grader, hints, stubs, solutions) and
`recorded()` without a line of any test naming it."""

from __future__ import annotations

import sys
import textwrap
from unittest import mock

import nbformat
import pytest
import test_exercises
import test_exercises_defects
import test_exercises_hints
from course import exercise_cells, exercise_ids, graded_notebooks, lessons, planted, run_cell, stubs

import smallem.course
from smallem.course import EXERCISES, grade, load_lessons, recorded

LESSON99 = '''
"""Lesson 99, a throwaway for tests/test_course.py: double every element."""

import numpy as np

from smallem.course import call, compare, exercise


@exercise("99.double", title="twice every element",
          hints=("Every element of x, multiplied by two: NumPy does the whole array at once.",
                 "Return 2 * x; a loop over the elements would give the same, more slowly."),
          mistakes={"squared": (lambda x: x * x, "where 2x gives"),
                    "unchanged": (lambda x: x, "double(x)[0] is 0.5 where 2x gives 1")},
          answer="double", solution_cell=\'\'\'
# Exercise 99.double · twice every element of x
def double(x):
    return 2 * x
\'\'\')
def double(answer):
    x = np.array([0.5, -1.5, 3.0])
    compare("double(x)", call(answer, x.copy(), on="x = [0.5, -1.5, 3]"), 2 * x, source="2x gives")
'''

STUB = "# Exercise 99.double · twice every element of x\ndef double(x):\n    ...\n"


@pytest.fixture
def lesson99(tmp_path, monkeypatch):
    """Lesson 99's folder beside the package's lessons, and its notebook in a notebooks folder."""
    lesson = tmp_path / "l99_doubling"
    (lesson / "recorded").mkdir(parents=True)
    (lesson / "__init__.py").write_text("from smallem.course.common import lesson_face\n\n"
                                        "__getattr__, __dir__ = lesson_face(__name__, 'exercises')\n")
    (lesson / "exercises.py").write_text(textwrap.dedent(LESSON99))
    (lesson / "recorded" / "doubled_h200.json").write_text('{"doubled": [1.0, -3.0, 6.0]}')
    folder = tmp_path / "notebooks"
    folder.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 99 · Doubling"),
                nbformat.v4.new_code_cell(STUB, metadata={"tags": ["exercise"]}),
                nbformat.v4.new_code_cell('check("99.double", double)')]
    nbformat.write(nb, folder / "99_doubling.ipynb")
    monkeypatch.setattr(smallem.course, "__path__", [*smallem.course.__path__, str(tmp_path)])
    with mock.patch.dict(EXERCISES):  # the registry as it was, afterwards
        yield folder
    for name in ("smallem.course.l99_doubling.exercises", "smallem.course.l99_doubling"):
        sys.modules.pop(name, None)


def test_lesson_99_is_picked_up_by_every_shared_test(lesson99, capsys):
    assert "99.double" not in exercise_ids()
    assert "smallem.course.l99_doubling.exercises" in load_lessons()
    assert smallem.course.lesson_folders()[-1] == "l99_doubling"
    assert recorded("doubled_h200") == {"doubled": [1.0, -3.0, 6.0]}  # its data, found in its folder
    assert "99.double" in exercise_ids() and lessons()["99"] == ["99.double"]
    assert ("99.double", "squared") in planted() and ("99.double", "unchanged") in planted()
    assert [p.name for p in graded_notebooks(lesson99)] == ["99_doubling.ipynb"]
    assert stubs(lesson99) == exercise_cells(lesson99 / "99_doubling.ipynb") == {"99.double": STUB}
    # the shared tests' own bodies, on lesson 99
    test_exercises.test_solution_is_accepted("99.double", capsys)
    for _, mistake in [case for case in planted() if case[0] == "99.double"]:
        test_exercises.test_planted_mistake_is_rejected_with_the_right_message("99.double", mistake)
    test_exercises.test_unfinished_answers_are_not_done_yet("99.double")
    test_exercises.test_a_raising_answer_is_reported_in_one_sentence("99.double")
    test_exercises_hints.test_every_exercise_has_two_or_three_hints("99.double")
    test_exercises_defects.test_a_function_that_returns_none_is_told_so("99.double")
    verdict = grade("99.double", run_cell("99.double", STUB))  # the notebook's stub, as shipped
    assert not verdict.done and "not done yet" in verdict.message


def test_lesson_99_notebook_gets_its_solution(lesson99):
    solutions = pytest.importorskip("test_notebook_solutions")
    load_lessons()
    nb, ids = solutions.with_solutions(lesson99 / "99_doubling.ipynb")
    assert ids == ["99.double"] and nb.cells[1].source == EXERCISES["99.double"].solution_cell


def test_a_planted_mistake_that_passes_fails_the_shared_test(lesson99):
    load_lessons()
    EXERCISES["99.double"].mistakes["not a mistake"] = (lambda x: 2 * x, "anything")
    with pytest.raises(AssertionError):
        test_exercises.test_planted_mistake_is_rejected_with_the_right_message("99.double", "not a mistake")

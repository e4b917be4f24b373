"""Exercises: the learner writes the heart of each lesson, and the package grades it.

In a notebook, an exercise cell (cell tag `exercise`) holds a stub to fill in; the next cell
calls `check(id, answer)`, which grades it with the package's own machinery (finite
differences, the tape, the reference on random inputs) and prints one sentence, or
`use(id, answer)`, which also hands the lesson the reference answer while the exercise is
unfinished. `show_solution(id)` prints one solution. The graders live in lesson01.py, ...
(found automatically), the framework in grading.py.
"""

from __future__ import annotations

import importlib
import pkgutil

from .grading import (
    EXERCISES,
    EXPECT_SOLVED,
    Exercise,
    ExerciseNotSolved,
    Verdict,
    check,
    exercise,
    grade,
    reveal,
    show_solution,
    solution,
    use,
)

__all__ = ["EXERCISES", "EXPECT_SOLVED", "Exercise", "ExerciseNotSolved", "Verdict", "check",
           "exercise", "grade", "reveal", "show_solution", "solution", "use"]

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("lesson")):
    importlib.import_module(f"{__name__}.{_module}")

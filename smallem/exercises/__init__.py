"""Exercises: the learner writes the heart of each lesson, and the package grades it.

In a notebook, an exercise cell (cell tag `exercise`) holds a stub to fill in; the next cell
calls `check(id, answer)`, which grades it with the package's own machinery (finite
differences, the tape, the reference on random inputs) and prints one sentence, or
`use(id, answer)`, which also hands the lesson the reference answer while the exercise is
unfinished. `hint(id)` gives its hints one at a time, `show_solution(id)` prints one solution.
Each verdict `check` gives is kept (progress.py, in the user's data folder): `progress()` shows
them, `answers()` gives the source of every passing answer. The graders live in lesson01.py, ...
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
    hint,
    progress,
    reveal,
    show_solution,
    solution,
    use,
)
from .progress import answers, data_folder, load, record, reset

__all__ = ["EXERCISES", "EXPECT_SOLVED", "Exercise", "ExerciseNotSolved", "Verdict", "check",
           "exercise", "grade", "hint", "progress", "reveal", "show_solution", "solution", "use",
           "answers", "data_folder", "load", "record", "reset"]

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("lesson")):
    importlib.import_module(f"{__name__}.{_module}")

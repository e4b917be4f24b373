"""Exercises: the learner writes the heart of each lesson, and the package grades it.

In a notebook, an exercise cell (cell tag `exercise`) holds a stub to fill in; the next cell
calls `check(id, answer)`, which grades it with the package's own machinery (finite
differences, the tape, the reference on random inputs) and prints one sentence, or
`use(id, answer)`, which also hands the lesson the reference answer while the exercise is
unfinished. `hint(id)` gives its hints one at a time, `show_solution(id)` prints one solution.
Each verdict `check` gives is kept (progress.py, in the user's data folder): `progress()` shows
them, `answers()` gives the source of every passing answer. The graders live in lesson01.py, ...
and in the course layer's lesson folders (smallem/course/l17_many_devices/graders.py), found by
`load_lessons` (a new lesson is a new lessonNN.py or lNN_name folder, named nowhere else), each exercise
with its planted mistakes; the framework is in grading.py.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import types
from typing import Any

from . import grading
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
    reveal,
    show_solution,
    solution,
    use,
)
from .progress import answers, data_folder, load, record, reset


class _ProgressModule(types.ModuleType):
    """progress.py (the store) that is also `progress()` (the table a learner asks for): both
    `from smallem.exercises import progress; progress()` and `import smallem.exercises.progress
    as store` work, where a function of the same name would hide the module."""

    def __call__(self) -> Any:
        return grading.progress()


sys.modules[f"{__name__}.progress"].__class__ = _ProgressModule
progress = sys.modules[f"{__name__}.progress"]  # the callable module, above

__all__ = ["EXERCISES", "EXPECT_SOLVED", "Exercise", "ExerciseNotSolved", "Verdict", "check",
           "exercise", "grade", "hint", "progress", "reveal", "show_solution", "solution", "use",
           "answers", "data_folder", "load", "record", "reset", "load_lessons"]


def load_lessons() -> list[str]:
    """Import every lesson module (lessonNN.py) in this package's folder, and every lesson folder
    of the course layer (smallem/course/lNN_name/); importing one registers its exercises.
    Returns the modules' names."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if re.fullmatch(r"lesson\d\d", m.name))
    for name in names:
        importlib.import_module(f"{__name__}.{name}")
    course = importlib.import_module("smallem.course")  # by name: the course layer imports exercises
    folders = sorted(m.name for m in pkgutil.iter_modules(course.__path__)
                     if re.fullmatch(r"l\d\d_\w+", m.name))
    for name in folders:
        importlib.import_module(f"{course.__name__}.{name}")
    return names + folders


load_lessons()

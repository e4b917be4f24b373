"""What the lessons share: the exercise framework (grading.py: `check`, `hint`, `use`, ...; graders.py:
the tools a grader grades with), the progress store (progress.py), predict-then-reveal
(predict.py), the NumPy references several lessons grade against (references.py), the views and
plots several notebooks show (attention, dashboard, plots, stepthrough, widgets) and the recorded
results found in the lessons' folders (recordings.py). A lesson imports from here, never from
another lesson. This package's face is `smallem.course`; `lesson_face` gives each lesson its own.

In a notebook, an exercise cell (cell tag `exercise`) holds a stub to fill in; the next cell
calls `check(id, answer)`, which grades it with the package's own machinery (finite
differences, the tape, the reference on random inputs) and prints one sentence, or
`use(id, answer)`, which also hands the lesson the reference answer while the exercise is
unfinished. `hint(id)` gives its hints one at a time, `show_solution(id)` prints one solution.
Each verdict `check` gives is kept (progress.py, in the user's data folder): `progress()` shows
them, `answers()` gives the source of every passing answer.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

LESSON = re.compile(r"l(\d\d)_\w+")  # a lesson's folder: l14_precision

# the course's names every lesson's face gives too (smallem.course has them)
SHARED = frozenset({"check", "hint", "progress", "reveal", "show_solution", "use", "solution", "grade",
                    "answers", "recorded", "trained", "EXERCISES"})


def lesson_face(package: str, *modules: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A lesson folder's `__getattr__` and `__dir__` (PEP 562): its own `modules` by name, their
    names (looked up in that order, each module imported when first asked for), and the learner's
    verbs (SHARED: `check`, `hint`, `progress`, `recorded`, ...) so that a notebook imports from
    one folder. Nothing is imported before a name is asked for."""
    own = {name: f"{package}.{name}" for name in modules}

    def __getattr__(name: str) -> Any:
        lesson = importlib.import_module(package)
        if name in own:
            value = importlib.import_module(own[name])
        elif name in SHARED:
            value = getattr(importlib.import_module("smallem.course"), name)
        else:
            found = (importlib.import_module(m) for m in own.values())
            module = next((m for m in found if hasattr(m, name)), None)
            if module is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            value = getattr(module, name)
        setattr(lesson, name, value)  # once: later reads are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *own})

    return __getattr__, __dir__

"""The course as the tests find it: exercises and their planted mistakes from the registry
(smallem/course/lNN_name/exercises.py, every lesson folder's, found by load_lessons), notebooks by
their names (notebooks/NN_name.ipynb), exercise cells by their `exercise` cell tag. No test lists a
lesson, so a lesson that lands (its folder and its notebook) is tested as it lands; CONTRIBUTING.md
says how a lesson registers."""

from __future__ import annotations

import linecache
import re
from pathlib import Path
from typing import Any

import nbformat
import numpy as np

from smallem.course import EXERCISES

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
HEADER = re.compile(r"# Exercise (\d\d\.\w+)")


def exercise_ids() -> list[str]:
    """Every registered exercise, "01.two_paths", ..., read when called (a lesson added later counts)."""
    return sorted(EXERCISES)


def lessons() -> dict[str, list[str]]:
    """Each lesson's number ("01") and its exercises."""
    found: dict[str, list[str]] = {}
    for exercise_id in exercise_ids():
        found.setdefault(exercise_id.split(".")[0], []).append(exercise_id)
    return found


def planted() -> list[tuple[str, str]]:
    """(exercise, mistake) for every planted mistake of every exercise."""
    return [(i, name) for i in exercise_ids() for name in EXERCISES[i].mistakes]


def notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The lesson notebooks, NN_name.ipynb, in order."""
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))


def exercise_cells(path: Path) -> dict[str, str]:
    """A notebook's exercise cells (tag `exercise`) as shipped, by the exercise each names."""
    found = {}
    for cell in nbformat.read(path, as_version=4).cells:
        if "exercise" in cell.metadata.get("tags", []):
            match = HEADER.match(cell.source)
            assert match, f"{path.name}: an exercise cell must open with '# Exercise NN.name'"
            assert match.group(1) not in found, f"{path.name}: two cells for {match.group(1)}"
            found[match.group(1)] = cell.source
    return found


def graded_notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The notebooks holding at least one exercise cell."""
    return [path for path in notebooks(folder) if exercise_cells(path)]


def stubs(folder: Path = NOTEBOOKS) -> dict[str, str]:
    """Every notebook's exercise cells, blank as shipped, by exercise."""
    found: dict[str, str] = {}
    for path in notebooks(folder):
        cells = exercise_cells(path)
        assert not set(cells) & set(found), f"{path.name} repeats {sorted(set(cells) & set(found))}"
        found |= cells
    return found


def run_cell(exercise_id: str, source: str) -> Any:
    """What a check cell after `source` receives, as a notebook kernel builds it (IPython keeps a
    cell's source in linecache, so a function's source can be read, as `blank` does)."""
    filename = f"<notebook cell {exercise_id}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"np": np, **EXERCISES[exercise_id].env}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102
    names = EXERCISES[exercise_id].answer
    return tuple(namespace[n] for n in names) if isinstance(names, tuple) else namespace[names]

"""The learner's progress: which exercises passed, and the source of each passing answer, kept in one
small JSON file in the user's data folder, so that `progress()` and the capstone read it from any
kernel. `check` records here; nothing here grades.
"""

from __future__ import annotations

import json
import os
import re
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import platformdirs

from ..errors import SmallemError, SmallemWarning

HOME = "SMALLEM_HOME"  # set it to keep progress elsewhere (the tests point it at a temporary folder)
FILE = "progress.json"
VERSION = 1
_warned: set[str] = set()  # one warning per trouble per session, not one per verdict


def data_folder() -> Path:
    """Where smallem keeps the learner's files: $SMALLEM_HOME, else the platform's user data folder,
    as platformdirs gives it ($XDG_DATA_HOME/smallem or ~/.local/share/smallem; ~/Library/Application
    Support/smallem on macOS; %LOCALAPPDATA%\\smallem on Windows)."""
    if os.environ.get(HOME):
        return Path(os.path.expanduser(os.environ[HOME]))
    return Path(platformdirs.user_data_dir("smallem", appauthor=False))


def progress_file() -> Path:
    return data_folder() / FILE


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, SmallemWarning, stacklevel=3)


def _entry(value: Any) -> dict | None:
    """One exercise's record as stored, or None when it is not one."""
    if not (isinstance(value, dict) and isinstance(value.get("passed"), bool)
            and isinstance(value.get("source"), (str, type(None))) and isinstance(value.get("when"), str)):
        return None
    return {"passed": value["passed"], "source": value["source"], "when": value["when"]}


def load() -> dict[str, dict[str, Any]]:
    """Every recorded exercise: id -> {"passed": bool, "source": str | None, "when": ISO time}.
    A missing file is no progress yet; a damaged one is ignored with a warning (the next verdict
    replaces it)."""
    path = progress_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):  # nothing kept yet (a save would say why not)
        return {}
    except (OSError, ValueError) as error:
        reason = "it is not JSON" if isinstance(error, ValueError) else (error.strerror or str(error))
        _warn_once(f"damaged {path}", f"smallem ignores the progress file {str(path)!r} ({reason}); "
                                      "the next verdict starts a new one.")
        return {}
    exercises = data.get("exercises") if isinstance(data, dict) else None
    if not isinstance(exercises, dict):
        _warn_once(f"damaged {path}", f"smallem ignores the progress file {str(path)!r} (it holds no "
                                      "'exercises' table); the next verdict starts a new one.")
        return {}
    entries = {key: _entry(value) for key, value in exercises.items() if isinstance(key, str)}
    return {key: value for key, value in entries.items() if value is not None}


def _save(entries: dict[str, dict[str, Any]]) -> None:
    from ..files import atomic_write  # temp file beside it, then rename: never half-written

    path = progress_file()
    text = json.dumps({"version": VERSION, "exercises": entries}, indent=1)  # ASCII: any source fits
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda fh: fh.write(text.encode("utf-8")), what="progress file")
    except (OSError, SmallemError) as error:
        reason = str(error) if isinstance(error, SmallemError) else (error.strerror or str(error))
        _warn_once(f"unwritable {path.parent}",
                   f"smallem cannot keep your progress in {str(path.parent)!r} ({reason}); grading works "
                   f"all the same, and setting {HOME} to a folder you can write keeps it there.")


def record(exercise_id: str, passed: bool, answer_source: str | None) -> None:
    """Keep one verdict. A pass stores the answer's source; a later wrong attempt does not erase an
    earned pass (the engine the capstone rebuilds is the last one that passed)."""
    entries = load()
    old = entries.get(exercise_id)
    if not passed and old is not None and old["passed"]:
        return
    entries[exercise_id] = {"passed": bool(passed), "source": answer_source if passed else None,
                            "when": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    _save(entries)


def answers() -> dict[str, str]:
    """The source of every passing answer that has one: id -> text to execute."""
    return {key: e["source"] for key, e in load().items() if e["passed"] and e["source"] is not None}


def reset() -> None:
    """Forget all progress (removes the file)."""
    try:
        progress_file().unlink(missing_ok=True)
    except OSError as error:
        raise SmallemError(f"cannot remove the progress file {str(progress_file())!r}: "
                           f"{error.strerror or error}") from None


def source_of(answer: Any) -> str | None:
    """What rebuilds `answer` in another kernel: a function's source (dedented), a value's repr;
    None when neither says it (a function typed at a prompt, a value whose repr is not code)."""
    import inspect
    import textwrap

    if callable(answer):
        try:
            return textwrap.dedent(inspect.getsource(answer))
        except (OSError, TypeError):
            return None
    if isinstance(answer, (tuple, list)):
        parts = [source_of(v) for v in answer]
        if None in parts:
            return None
        inside = ", ".join(parts) + ("," if len(parts) == 1 and isinstance(answer, tuple) else "")
        return f"({inside})" if isinstance(answer, tuple) else f"[{inside}]"
    import numpy as np

    if isinstance(answer, np.ndarray) and answer.dtype.kind in "biuf":
        return f"np.array({answer.tolist()!r})"
    if isinstance(answer, np.generic):
        answer = answer.item()
    return repr(answer) if isinstance(answer, (bool, int, float, str)) else None


# -- the table ------------------------------------------------------------------------------

_MARK = {"passed": "✓", "tried": "✗", "todo": "·"}


class Progress:
    """What `progress()` shows: per lesson, each exercise passed (✓), tried (✗) or to do (·).
    Its repr is a text table; a notebook shows it as an HTML table."""

    def __init__(self, lessons: list[tuple[str, str, list[tuple[str, str]]]], file: Path) -> None:
        self.lessons = lessons  # [(lesson "05", title, [(exercise id, "passed" | "tried" | "todo")])]
        self.file = file

    @property
    def done(self) -> int:
        return sum(state == "passed" for _, _, rows in self.lessons for _, state in rows)

    @property
    def total(self) -> int:
        return sum(len(rows) for _, _, rows in self.lessons)

    def _footer(self) -> str:
        return (f"{self.done} of {self.total} exercises done. ✓ right, ✗ tried, · to do; "
                f"kept in {self.file} (set {HOME} to move it).")

    def __repr__(self) -> str:
        width = max((len(title) for _, title, _ in self.lessons), default=0)
        lines = []
        for lesson, title, rows in self.lessons:
            count = sum(state == "passed" for _, state in rows)
            marks = "  ".join(f"{_MARK[state]} {eid.split('.', 1)[1]}" for eid, state in rows)
            lines.append(f"{lesson}  {title:<{width}}  {count}/{len(rows)}  {marks}")
        return "\n".join(lines + [self._footer()])

    __str__ = __repr__

    def _repr_html_(self) -> str:
        from html import escape

        rows = []
        for lesson, title, entries in self.lessons:
            count = sum(state == "passed" for _, state in entries)
            marks = " &nbsp; ".join(f"{_MARK[state]}&nbsp;<code>{escape(eid.split('.', 1)[1])}</code>"
                                    for eid, state in entries)
            rows.append(f"<tr><td>{lesson}</td><td style='text-align:left'>{escape(title)}</td>"
                        f"<td>{count}/{len(entries)}</td><td style='text-align:left'>{marks}</td></tr>")
        return ("<table><tr><th>lesson</th><th>topic</th><th>done</th><th>exercises</th></tr>"
                + "".join(rows) + f"</table><p>{escape(self._footer())}</p>")


def _title(lesson: str) -> str:
    """"the chain rule by hand", from the first line of lessonNN.py's docstring."""
    module = sys.modules.get(f"{__package__}.lesson{lesson}")
    first = ((module.__doc__ or "") if module else "").strip().splitlines()[:1]
    match = re.match(r"Lesson \d+, ([^:]+):", first[0]) if first else None
    return match.group(1) if match else f"lesson {lesson}"


def table(exercise_ids: list[str]) -> Progress:
    """Each lesson's exercises among `exercise_ids`: passed, tried or to do, from the verdicts
    recorded (grading's `progress()` passes every registered exercise)."""
    entries = load()
    lessons: dict[str, list[tuple[str, str]]] = {}
    for eid in exercise_ids:
        e = entries.get(eid)
        state = "todo" if e is None else "passed" if e["passed"] else "tried"
        lessons.setdefault(eid.split(".", 1)[0], []).append((eid, state))
    return Progress([(k, _title(k), rows) for k, rows in sorted(lessons.items())], progress_file())

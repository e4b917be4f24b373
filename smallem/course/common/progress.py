"""The learner's progress: which exercises passed, and the source of each passing answer, kept in one
small JSON file in the user's data folder, so that `progress()` and the capstone read it from any
kernel. `check` records here; nothing here grades.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import platformdirs

from ...errors import SmallemError, SmallemWarning

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


# -- reading and writing the file: under a lock, never losing what it holds ----------------------
LOCK = ".progress.json.lock"  # beside the file: every kernel takes it before reading to rewrite
LOCK_WAIT = 30.0  # seconds: a rewrite takes milliseconds, so only a stuck kernel makes anyone wait


class _Unusable(Exception):
    """The progress file cannot be used now (a pipe in its place, a lock not to be had): why."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "not a regular file"


def _read_bytes(path: Path) -> bytes | None:
    """The file's bytes, None when there is none. Opened without blocking, so a named pipe in its
    place is refused (never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _Unusable(f"{str(path)!r} is {_kind(mode)}, not a regular file, so smallem neither "
                            "reads nor replaces it")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    finally:
        os.close(fd)


def _parse(raw: bytes) -> dict:
    """The file's whole content (unknown fields too), or ValueError saying why it is not ours."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("it is not JSON: damaged, perhaps cut short") from None
    if not isinstance(data, dict) or not isinstance(data.get("exercises"), dict):
        raise ValueError("it holds no 'exercises' table")
    version = data.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise ValueError(f"a newer smallem wrote it (format {version}; this one reads {VERSION})")
    if version != VERSION:
        raise ValueError(f"it is not a smallem progress file of format {VERSION}")
    return data


def _aside(path: Path, tag: str) -> Path:
    """Rename `path` to a free name beside it (progress-damaged-20260101T120000Z.json): kept, never
    overwritten."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for n in range(1000):
        target = path.with_name(f"{path.stem}-{tag}-{stamp}{f'-{n}' if n else ''}{path.suffix}")
        if not os.path.lexists(target):
            os.rename(path, target)  # under the lock: no other kernel picks the same name meanwhile
            return target
    raise OSError(f"no free name beside {str(path)!r}")


def _read(path: Path, locked: bool) -> dict:
    """The file's content, or a new one. A file that cannot be read or is not ours is moved aside
    with a warning naming where (only `locked`: no other kernel is reading it to rewrite it)."""
    try:
        raw = _read_bytes(path)
        return {"version": VERSION, "exercises": {}} if raw is None else _parse(raw)
    except (OSError, ValueError) as error:
        unreadable = isinstance(error, OSError)
        reason = (error.strerror or str(error)) if unreadable else str(error)
    if not locked:
        raise _Unusable(f"{str(path)!r} cannot be read ({reason}), and stays as it is")
    try:
        kept = _aside(path, "unreadable" if unreadable else "damaged")
    except OSError as error:
        raise _Unusable(f"{str(path)!r} cannot be read ({reason}) nor moved aside "
                        f"({error.strerror or error})") from None
    _warn_once(f"moved {kept}", f"smallem cannot use the progress file {str(path)!r} ({reason}): it is "
                                f"moved aside to {str(kept)!r}, as it was, and a new one starts.")
    return {"version": VERSION, "exercises": {}}


@contextmanager
def _locked(create: bool) -> Iterator[bool]:
    """Hold the folder's progress lock (True), or yield False where none can be made: the folder
    is missing (and `create` False) or cannot be written."""
    from filelock import FileLock, Timeout

    folder, lock = data_folder(), None
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(folder / LOCK, timeout=LOCK_WAIT, mode=0o666)
        lock.acquire()
    except Timeout:
        raise _Unusable(f"another kernel has held {str(folder / LOCK)!r} for {LOCK_WAIT:g} s") from None
    except OSError as error:
        if create:
            raise _Unusable(error.strerror or str(error)) from None
        lock = None
    try:
        yield lock is not None
    finally:
        if lock is not None:
            lock.release()


def load() -> dict[str, dict[str, Any]]:
    """Every recorded exercise: id -> {"passed": bool, "source": str | None, "when": ISO time}.
    A missing file is no progress yet; one that cannot be read is moved aside with a warning."""
    path = progress_file()
    try:
        with _locked(create=False) as locked:
            exercises = _read(path, locked)["exercises"]
    except _Unusable as why:
        _warn_once(f"unusable {path}", f"smallem ignores your progress file for now: {why}.")
        return {}
    entries = {key: _entry(value) for key, value in exercises.items() if isinstance(key, str)}
    return {key: value for key, value in entries.items() if value is not None}


def _save(data: dict) -> None:
    from ...files import atomic_write  # temp file beside it, then rename: never half-written

    text = json.dumps(data, indent=1)  # ASCII: any source fits
    atomic_write(progress_file(), lambda fh: fh.write(text.encode("utf-8")), what="progress file")


def record(exercise_id: str, passed: bool, answer_source: str | None) -> None:
    """Keep one verdict: read, merge and write under the folder's lock, so two kernels recording
    at once both keep theirs, and every field of the file, known or not, is kept. A pass stores
    the answer's source; a later wrong attempt does not erase an earned pass (the engine the
    capstone rebuilds is the last one that passed)."""
    path = progress_file()
    try:
        with _locked(create=True):
            data = _read(path, True)
            old = data["exercises"].get(exercise_id)
            if not passed and _entry(old) is not None and old["passed"]:
                return
            data["exercises"][exercise_id] = {
                **(old if isinstance(old, dict) else {}), "passed": bool(passed),
                "source": answer_source if passed else None,
                "when": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            _save(data)
    except (OSError, SmallemError, _Unusable) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        _warn_once(f"unwritable {path.parent}",
                   f"smallem cannot keep your progress in {str(path.parent)!r} ({reason}); grading works "
                   f"all the same, and setting {HOME} to a folder you can write keeps it there.")


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
            text = textwrap.dedent(inspect.getsource(answer))
        except (OSError, TypeError):
            return None
        return _lambda_alone(text) if getattr(answer, "__name__", "") == "<lambda>" else text
    if isinstance(answer, (tuple, list)):
        parts = [source_of(v) for v in answer]
        if None in parts:
            return None
        if answer and all(callable(v) and not p.startswith("lambda") for v, p in zip(answer, parts)):
            return "\n\n".join(parts)  # a pair of defs (11.split_heads): run as a cell, in order
        inside = ", ".join(parts) + ("," if len(parts) == 1 and isinstance(answer, tuple) else "")
        return f"({inside})" if isinstance(answer, tuple) else f"[{inside}]"
    import numpy as np

    if isinstance(answer, np.ndarray) and answer.dtype.kind in "biuf":
        return f"np.array({answer.tolist()!r})"
    if isinstance(answer, np.generic):
        answer = answer.item()
    return repr(answer) if isinstance(answer, (bool, int, float, str)) else None


def _lambda_alone(text: str) -> str | None:
    """A lambda's own expression out of the line that holds it (`check("02.exp_rule", lambda ...)`
    gives `lambda ...`), so another kernel can rebuild it; None when the line holds several."""
    import ast

    try:
        found = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Lambda)]
    except SyntaxError:  # a fragment of a longer statement
        return None
    return ast.get_source_segment(text, found[0]) if len(found) == 1 else None


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
    """"the chain rule by hand", from the first line of its lesson's exercises.py docstring."""
    folder = f"{__package__.rsplit('.', 1)[0]}.l{lesson}_"  # smallem.course.l01_chain_rule.exercises
    module = next((m for name, m in list(sys.modules.items())
                   if name.startswith(folder) and name.endswith(".exercises")), None)
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

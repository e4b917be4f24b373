"""What the course tells a learner to type works where they type it: every call a notebook's
introduction or one of its verdicts names (`hint('02.exp_rule')`, `show_solution(...)`,
`progress()`) runs in a namespace holding only what that notebook has imported before its first
exercise, and an answer that holds itself gets one sentence, not a RecursionError."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from smallem.course import EXERCISES, check, grade

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
ADVICE = re.compile(r"\b(?:hint|show_solution|progress)\((?:\s*['\"][^'\"]*['\"]\s*)?\)")
GRADED = re.compile(r"\b(?:check|use)\(\s*['\"](\d\d\.\w+)['\"]")


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def exercise_ids(path: Path) -> list[str]:
    found = [m for c in cells(path) if c["cell_type"] == "code" for m in GRADED.findall("".join(c["source"]))]
    return list(dict.fromkeys(found))


def setup_namespace(path: Path) -> dict:
    """The notebook's imports, each cell's, up to the first cell that grades an exercise (where a
    first verdict can appear): what the learner's kernel holds when the advice is given."""
    namespace: dict = {}
    for cell in cells(path):
        source = "".join(cell["source"])
        if cell["cell_type"] != "code":
            continue
        if GRADED.search(source):
            break
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a cell of IPython magics: no imports to read
            continue
        imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        exec(compile(ast.Module(imports, []), f"{path.name} imports", "exec"), namespace)  # noqa: S102
    return namespace


def advice(path: Path) -> list[str]:
    """Every call the learner is told to type: in the prose (the introduction's `hint("ID")`,
    with the notebook's first exercise for ID) and in each exercise's verdicts, not done and ✗."""
    ids = exercise_ids(path)
    quoted = re.compile(f"`({ADVICE.pattern})`")  # a call written as code in the prose
    said = [m.group(1) for c in cells(path) if c["cell_type"] == "markdown"
            for m in quoted.finditer("".join(c["source"]))]
    for eid in ids:
        for answer in (..., "not an answer"):  # a stub's verdict, then a wrong one's
            said += [m.group(0) for m in ADVICE.finditer(grade(eid, answer).message)]
    first = ids[0] if ids else next(iter(EXERCISES))
    return list(dict.fromkeys(re.sub(r"""(['"])ID\1""", repr(first), call) for call in said))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_call_a_notebook_tells_the_learner_to_type_runs_there(path, monkeypatch, tmp_path):
    monkeypatch.setenv("SMALLEM_HOME", str(tmp_path))
    namespace = setup_namespace(path)
    calls = advice(path)
    if exercise_ids(path):
        assert any(c.startswith("hint(") for c in calls) and "progress()" in calls, calls
    failed = []
    for call in calls:
        shown = io.StringIO()
        try:
            with contextlib.redirect_stdout(shown):
                result = eval(call, namespace)  # noqa: S307  (the learner's own typing)
        except NameError as error:
            failed.append(f"{call}: {error}")
            continue
        assert (shown.getvalue() or repr(result)).strip(), call  # it answered with something
    assert not failed, failed


def test_an_answer_that_holds_itself_gets_one_sentence(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SMALLEM_HOME", str(tmp_path))
    loop: list = []
    loop.append(loop)
    pair: list = [2.0]
    pair.append(pair)
    for answer in (loop, pair, (loop, 2.0), {"a": loop}):
        verdict = check("01.two_paths", answer)
        assert not verdict.ok and verdict.done and "holds itself" in verdict.message
        assert "\n" not in verdict.message and verdict.message.startswith("✗ 01.two_paths")
    assert "Traceback" not in capsys.readouterr().out

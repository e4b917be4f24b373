"""Every notebook run once more with its exercises solved: each `exercise` cell is replaced by
its `solution_cell`, and the notebook is executed under SMALLEM_EXPECT_SOLVED=1, so an exercise
whose solution its own grader rejects fails here. (nbval runs the notebooks as shipped, stubs
blank.) One kernel serves every notebook, reset in between; each notebook runs up to its last
graded cell, which skips the long training at the end of notebook 05. Notebook 13 (the capstone)
runs whole, after every solution is written into the progress store it reads. The notebooks
whose exercises carry an `alternate_cell` (a second right answer in another style, kept beside
the grader) run once more with those: an answer the grader accepts must keep the lesson going."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from course import HEADER, NOTEBOOKS, exercise_cells, graded_notebooks

nbclient = pytest.importorskip("nbclient")

from run_cells_twice import HANG_SECONDS  # noqa: E402 (tests/, a helper beside this file)

from smallem.course import EXERCISES  # noqa: E402
from smallem.course.common.progress import HOME, answers, record  # noqa: E402
from smallem.course.l13_your_engine.pieces import ROLES  # noqa: E402
from smallem.course.l13_your_engine.your_transformer import TRANSFORMER_ROLES  # noqa: E402

PATHS = graded_notebooks()  # every notebook with an `exercise` cell (10 and 13 have none)
CAPSTONE = NOTEBOOKS / "13_your_engine.ipynb"
GRADED = re.compile(r"\b(check|use|reveal)\(")


def with_solutions(path: Path, alternate: bool = False) -> tuple[nbformat.NotebookNode, list[str]]:
    """The notebook with every exercise cell solved (by its alternate answer where it has one,
    when `alternate`), cut after its last graded cell (or, for the alternates, the last cell
    that uses an answer)."""
    nb = nbformat.read(path, as_version=4)
    ids = list(exercise_cells(path))
    for cell in nb.cells:
        if "exercise" in cell.metadata.get("tags", []):
            ex = EXERCISES[HEADER.match(cell.source).group(1)]
            cell.source = (alternate and ex.alternate_cell) or ex.solution_cell
    # An alternate answer runs on to the last cell that uses it: that is where it must still work.
    answers_of = [EXERCISES[i].answer for i in ids]
    names = {n for a in answers_of for n in ([a] if isinstance(a, str) else a)}
    used = re.compile(r"\b(check|use|reveal)\(" + "".join(rf"|\b{n}\b" for n in names if alternate))
    graded = [k for k, c in enumerate(nb.cells) if c.cell_type == "code" and used.search(c.source)]
    nb.cells = nb.cells[:graded[-1] + 1] if graded else nb.cells
    return nb, ids


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SMALLEM_EXPECT_SOLVED", "1")  # check() raises on any answer not right
        env.setenv(HOME, str(tmp_path_factory.mktemp("progress")))  # never the user's own store
        env.setenv("MPLBACKEND", "Agg")
        client = nbclient.NotebookClient(nbformat.v4.new_notebook(), timeout=HANG_SECONDS,
                                         startup_timeout=HANG_SECONDS, kernel_name="python3",
                                         resources={"metadata": {"path": str(NOTEBOOKS)}})
        with client.setup_kernel():
            yield client


def test_every_exercise_cell_names_a_registered_exercise_in_its_own_notebook():
    found = [i for path in PATHS for i in with_solutions(path)[1]]
    assert len(found) == len(set(found)) and set(found) == set(EXERCISES)
    assert all(i.split(".")[0] == path.name[:2] for path in PATHS for i in exercise_cells(path))


ALTERNATE_PATHS = [p for p in PATHS if any(EXERCISES[i].alternate_cell for i in exercise_cells(p))]


@pytest.mark.solutions
@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_notebook_runs_with_its_solutions(kernel, path):
    nb, ids = with_solutions(path)
    assert len(ids) >= 2, f"{path.name} has {len(ids)} exercises"  # 2 to 4 for 01-08: test_exercises
    printed = run(kernel, nb)
    for exercise_id in ids:
        assert f"✓ {exercise_id} right" in printed


def run(kernel, nb):
    kernel.nb = nb
    kernel.execute_cell(nbformat.v4.new_code_cell("%reset -f"), 0)  # a fresh namespace
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            kernel.execute_cell(cell, index)  # raises CellExecutionError on any error
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs if o.get("output_type") == "stream")


@pytest.mark.solutions
def test_the_capstone_runs_on_every_solution(kernel):
    kept = answers()  # what check() kept while the notebooks above ran with their solutions
    roles = set(ROLES) | set(TRANSFORMER_ROLES)
    for exercise_id in roles - set(kept):  # any not run in this session: its solution, as check keeps it
        record(exercise_id, True, EXERCISES[exercise_id].solution_cell)
    printed = run(kernel, nbformat.read(CAPSTONE, as_version=4))
    print(f"{len(roles & set(kept))} of the {len(roles)} pieces came from the notebooks' own check() calls")
    assert "12 of 12 pieces are yours" in printed
    assert "✓ Your engine trained the byte MLP: every piece is yours." in printed
    assert "✗ The race diverged" in printed and "your 02.exp_rule" in printed  # the planted one
    assert "✓ Your engine trained a Transformer: every piece is yours." in printed
    assert "your 11.causal_mask is wrong" in printed.lower()  # part two's planted one


# After the capstone's run on every solution: these notebooks' check() calls keep their second
# answers in the store, which would replace the solutions that run reads.
@pytest.mark.solutions
@pytest.mark.parametrize("path", ALTERNATE_PATHS, ids=lambda p: p.stem)
def test_notebook_runs_with_its_alternate_answers(kernel, path):
    nb, ids = with_solutions(path, alternate=True)
    printed = run(kernel, nb)
    for exercise_id in ids:
        assert f"✓ {exercise_id} right" in printed


@pytest.mark.solutions
def test_the_capstone_runs_on_the_alternate_answers(kernel):
    """Both parts from the second answers (02-12 give every piece one), as check() keeps them:
    the byte MLP and the Transformer must train as the package's do."""
    for exercise_id in set(ROLES) | set(TRANSFORMER_ROLES):
        ex = EXERCISES[exercise_id]
        record(exercise_id, True, ex.alternate_cell or ex.solution_cell)
    printed = run(kernel, nbformat.read(CAPSTONE, as_version=4))
    assert "✓ Your engine trained the byte MLP: every piece is yours." in printed
    assert "✓ Your engine trained a Transformer: every piece is yours." in printed

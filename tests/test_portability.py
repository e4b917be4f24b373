"""Works wherever a learner opens it: the wheel installed non-editable elsewhere runs every
notebook from a copy of notebooks/ outside the tree, each code cell twice in a row; results a
notebook shows ship as package data; the package keeps to Python 3.10."""

import filecmp
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A venv outside the tree holding smallem's wheel (not editable). Its dependencies come
    from this venv's site-packages through a .pth line (nothing downloaded; this venv's
    editable smallem is not seen, as .pth files there are not read from a .pth path)."""
    base = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(base / "dist"), str(ROOT)], check=True, capture_output=True)
    wheel, = (base / "dist").glob("smallem-*.whl")
    python = bare_venv(base)
    venv = python.parent.parent
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    where = subprocess.run([python, "-c", "import smallem; print(smallem.__file__)"], cwd=base,
                           check=True, capture_output=True, text=True).stdout.strip()
    assert where.startswith(str(venv)), where  # the wheel's copy, not the tree's
    copy = base / "lessons"
    shutil.copytree(ROOT / "notebooks", copy, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    return venv, wheel, copy


def bare_venv(base: Path) -> Path:
    """A venv whose only extra path is this venv's site-packages (its editable smallem is not
    seen: .pth files there are not read from a .pth path). Returns its python."""
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "here-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


@pytest.mark.portability
def test_the_sdist_runs_its_own_tests(tmp_path):
    """The sdist, built offline and unpacked, holds what its tests need: pytest collects every
    test and every notebook there without an error, with the sdist's own smallem."""
    import tarfile

    from setuptools import build_meta  # noqa: F401 - the backend pyproject names, installed

    build = ("import sys; from setuptools import build_meta; "
             "print(build_meta.build_sdist(sys.argv[1]))")  # what `python -m build --sdist
    # --no-isolation` calls, without the `build` package
    # from a copy without the egg-info a build here left: setuptools adds what an old
    # SOURCES.txt lists, which a fresh clone does not have
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "*.egg-info", "build", "dist", "__pycache__", ".ipynb_checkpoints"))
    name = subprocess.run([sys.executable, "-c", build, str(tmp_path / "dist")], cwd=source,
                          check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    with tarfile.open(tmp_path / "dist" / name) as archive:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.10.12 on
        archive.extractall(tmp_path / "unpacked", **safe)
    tree, = (tmp_path / "unpacked").iterdir()
    for needed in ("conftest.py", "tests/conftest.py", "tests/jupyterlab_browser.py",
                   "tests/run_cells_twice.py", "CHANGELOG.md", "CONTRIBUTING.md", "CITATION.cff",
                   "smallem/py.typed", *(f"notebooks/{p.name}" for p in NOTEBOOKS)):
        assert (tree / needed).is_file(), f"the sdist lacks {needed}"
    python = bare_venv(tmp_path)
    where = subprocess.run([python, "-c", "import smallem; print(smallem.__file__)"], cwd=tree,
                           check=True, capture_output=True, text=True).stdout.strip()
    assert where.startswith(str(tree)), where  # the sdist's copy, not this tree's
    out = subprocess.run([python, "-m", "pytest", "--collect-only", "-q"], cwd=tree,
                         capture_output=True, text=True)
    summary = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 0 and "error" not in summary, out.stdout[-3000:] + out.stderr[-3000:]
    collected = {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    assert {f"notebooks/{p.name}" for p in NOTEBOOKS} <= collected, sorted(collected)
    assert "tests/test_portability.py" in collected and "tests/test_cli.py" in collected


@pytest.mark.portability
def test_the_wheel_carries_the_recorded_results_and_the_command(installed):
    venv, wheel, _ = installed
    out = subprocess.run([venv / "bin" / "smallem", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("smallem "), out
    out = subprocess.run([venv / "bin" / "python", "-c", "from smallem.course.common.recordings import "
                          "names; print(names())"], capture_output=True, text=True, check=True)
    assert "bench_h200" in out.stdout and "capture_2000" in out.stdout
    import zipfile

    assert "smallem/py.typed" in zipfile.ZipFile(wheel).namelist()  # PEP 561: typed


@pytest.mark.portability
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_runs_from_a_copy_each_cell_twice(installed, notebook):
    venv, _, copy = installed
    out = subprocess.run([venv / "bin" / "python", ROOT / "tests" / "run_cells_twice.py",
                          copy / notebook.name], cwd=copy, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-6000:]
    print(out.stdout.strip())  # its time, under -s


def test_the_recorded_results_are_the_benchmarks_own():
    """The package's copies equal a run kept in benchmarks/results/, where README cites them from."""
    shipped = sorted((ROOT / "smallem" / "course").glob("*/recorded/*.json"))  # in each lesson's folder
    assert shipped
    for file in shipped:
        kept = sorted((ROOT / "benchmarks" / "results").rglob(file.name))
        assert any(filecmp.cmp(file, k, shallow=False) for k in kept), file.name


def _readme_commands() -> list[str]:
    import re

    readme = (ROOT / "README.md").read_text()
    return re.findall(r"```sh\n(python3 -m venv .*?)\n```", readme)


def test_readme_first_command_opens_jupyterlab_for_root_and_for_anyone(tmp_path):
    """The JupyterLab part of README's first command, run as it is written (with this venv's
    jupyter): it must serve its API whoever runs it, root included (a container)."""
    import json
    import re
    import signal
    import time
    import urllib.error
    import urllib.request

    first, second = _readme_commands()
    assert "pip install -q -e ." in first and 'pip install -q -e ".[test]"' in second
    lab = first.split("&&")[-1].split()
    assert lab[0] == ".venv/bin/jupyter" and lab[1] == "lab"
    command = [str(Path(sys.executable).parent / "jupyter"), *lab[1:], "--ServerApp.port=0",
               "--ServerApp.open_browser=False"]
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path), "BROWSER": "true"}
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = []
    try:
        for line in server.stdout:
            seen.append(line)
            found = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
            if found:
                break
        assert found, "JupyterLab did not start:\n" + "".join(seen[-20:])
        local = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy
        for attempt in range(60):  # the URL is printed a moment before the server answers
            try:
                with local.open(found.group(1) + "/api", timeout=30) as answer:
                    assert "version" in json.loads(answer.read())
                break
            except urllib.error.URLError:
                if attempt == 59:
                    raise
                time.sleep(0.5)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_a_training_cell_run_again_starts_its_dashboard_over(monkeypatch):
    """Notebook 05's training cell run twice with the same LiveDashboard: the second run is
    drawn alone in its own cell's output, and the next cell's records are that run's."""
    import IPython.display

    from smallem.course import LiveDashboard
    from smallem.models import Mlp
    from smallem.models.mlp import MlpConfig
    from smallem.optim import SGD
    from smallem.training import train_step

    shown = []

    class Handle:
        def update(self, obj):
            pass

    monkeypatch.setattr(IPython.display, "display",
                        lambda obj, display_id=False: shown.append(obj) or Handle())
    model = Mlp(MlpConfig(context=4, embed=4, hidden=8), "cpu64", seed=0)
    rng = __import__("numpy").random.default_rng(0)

    def loss(tape):
        contexts = rng.integers(0, 257, size=(8, 4))
        return model.loss(tape, contexts, rng.integers(0, 257, size=8))

    live = LiveDashboard(every=2, model=model, steps=6, interval=0.0)
    for run in (1, 2):  # notebook 05's loop: the monitor observes the steps it wants
        optimizer = SGD(0.05)
        for step in range(1, 7):
            train_step("cpu64", model, optimizer, loss, observer=live if live.wants(step) else None)
        assert [r["step"] for r in live.records] == [1, 2, 4, 6], f"run {run}"
    assert len(shown) == 2  # one figure per run, each in its own cell


def _setup_cell() -> str:
    """The first-cell pattern, as CONTRIBUTING.md writes it."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    return text.split("### The first cells")[1].split("```python\n")[1].split("```")[0].strip()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_first_code_cell_says_how_to_install_smallem(notebook, monkeypatch):
    """On a hosted notebook service without smallem: one sentence on how to install it, shown
    by IPython as that one line, never a bare ModuleNotFoundError."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source.strip() == _setup_cell(), "the first code cell is CONTRIBUTING's setup cell"
    assert not first.outputs
    monkeypatch.setitem(sys.modules, "smallem", None)  # `import smallem` now fails
    with pytest.raises(Exception) as raised:
        exec(compile(first.source, notebook.name, "exec"), {})  # noqa: S102
    assert not isinstance(raised.value, ModuleNotFoundError)
    shown = raised.value._render_traceback_()
    assert len(shown) == 1 and "%pip install PATH" in shown[0] and "restart the kernel" in shown[0]


def test_what_a_project_of_this_kind_carries():
    import re

    import smallem

    assert "MIT License" in (ROOT / "LICENSE").read_text() and "The smallem authors" in \
        (ROOT / "LICENSE").read_text()
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert all(f"## {v}" in changelog for v in ("Unreleased", "0.3.0", "0.2.0", "0.1.0"))
    # CITATION names the newest release; between releases __version__ is the next one's .dev.
    released = re.search(r"^## (\d+\.\d+\.\d+) \(", changelog, re.M).group(1)
    citation = (ROOT / "CITATION.cff").read_text()
    assert re.search(rf"^version: {re.escape(released)}$", citation, re.M)
    assert smallem.__version__ == released or (
        ".dev" in smallem.__version__ and smallem.__version__ > released), smallem.__version__
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "MIT"' in pyproject and 'requires-python = ">=3.10"' in pyproject
    assert '"cupy-cuda12x' in pyproject and '"cupy-cuda13x' in pyproject
    assert "nbval-check-output" in (ROOT / "CONTRIBUTING.md").read_text()
    # what a scientific-Python maintainer looks for: classifiers, typing, the data folder's library
    for classifier in ("Programming Language :: Python :: 3.10", "Programming Language :: Python :: 3.13",
                       "Typing :: Typed", "Intended Audience :: Education"):
        assert f'"{classifier}"' in pyproject, classifier
    assert re.search(r'^\s+"platformdirs>=', pyproject, re.M)
    assert '"smallem" = ["py.typed"]' in pyproject and (ROOT / "smallem" / "py.typed").is_file()

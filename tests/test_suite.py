"""The suite's own rules (issue 31): a pass or a fail never depends on how busy the machine is
(no per-cell wall-clock limit a slow cell reaches, only one that catches a hang), every skip is
explained at the end of a run, and CI runs the README's test command."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from run_cells_twice import HANG_SECONDS

ROOT = Path(__file__).resolve().parents[1]


def addopts() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'^addopts = """(.*?)"""', text, re.M | re.S).group(1).replace("\\\n", " ")


def test_the_only_wall_clock_limits_of_notebook_runs_catch_a_hang():
    assert HANG_SECONDS >= 3600
    options = addopts().split()
    assert f"--nbval-cell-timeout={HANG_SECONDS}" in options
    assert f"--nbval-kernel-startup-timeout={HANG_SECONDS}" in options
    clients = 0
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                    node.func, "id", None)) == "NotebookClient":
                clients += 1
                limits = {k.arg: k.value for k in node.keywords if "timeout" in (k.arg or "")}
                assert set(limits) == {"timeout", "startup_timeout"}, (path.name, set(limits))
                assert all(isinstance(v, ast.Name) and v.id == "HANG_SECONDS"
                           for v in limits.values()), f"{path.name}:{node.lineno}"
    assert clients >= 2  # the solutions run and the twice-run
    browser = (ROOT / "tests" / "test_browser.py").read_text()
    assert re.search(r"^RUN_ALL_TIMEOUT = HANG_SECONDS\b", browser, re.M)


def test_every_skip_is_explained_at_the_end_of_a_run():
    assert "-ra" in addopts().split()


def test_ci_runs_the_readme_command_on_three_pythons():
    workflow = (ROOT / ".github" / "workflows" / "tests.yml").read_text()
    assert re.search(r'python-version: \[\s*"3\.10",\s*"3\.11",\s*"3\.13"\s*\]', workflow), workflow
    assert "container: python:${{ matrix.python-version }}-bookworm" in workflow  # Debian
    assert re.search(r"^\s+run: \.ci/run$", workflow, re.M) and 'CI: "1"' in workflow
    script = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^(python3 -m venv .*-m pytest)$", readme, re.M).group(1)
    assert script.rstrip().endswith(command), "CI runs README's test command, verbatim"
    assert "apt-get install -y -qq chromium" in script
    hooks = (ROOT / ".pre-commit-config.yaml").read_text()
    assert "ruff-pre-commit" in hooks and re.search(r"^\s+- id: ruff-check$", hooks, re.M)
    assert "notebooks" in hooks and "jupyter" in hooks  # CONTRIBUTING: their cells pass ruff too
    assert re.search(r"^  workflow_dispatch:", workflow, re.M)
    assert re.search(r"^concurrency:\n  group: .*\n  cancel-in-progress: true$", workflow, re.M)


def test_pytest_refuses_a_mistyped_marker_or_setting_and_a_passing_xfail():
    text = (ROOT / "pyproject.toml").read_text()
    assert {"--strict-config", "--strict-markers"} <= set(addopts().split())
    assert re.search(r'^minversion = "8\.0"', text, re.M) and re.search(r"^xfail_strict = true$", text, re.M)


def test_nbval_waits_for_a_cells_output_as_long_as_for_a_hang(tmp_path):
    """nbval's fixed 5-s wait for each output message after a cell's reply failed 05's long
    dashboard cell at a load of 6; the root conftest raises it on every collected cell."""
    (tmp_path / "probe.py").write_text(
        "def pytest_collection_finish(session):\n"
        "    print('WAITS', sorted({getattr(i, 'output_timeout', None) for i in session.items}))\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "probe",
                           "notebooks/01_chain_rule_by_hand.ipynb"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert f"WAITS [{HANG_SECONDS}]" in done.stdout, done.stdout + done.stderr


def test_a_long_test_says_what_it_is_doing_and_a_quick_one_stays_quiet(pytestconfig):
    root, = [p for p in pytestconfig.pluginmanager.get_plugins()  # the root conftest.py, loaded
             if getattr(p, "__file__", None) == str(ROOT / "conftest.py")]
    long_stretch = root.long_stretch

    class Item:
        def __init__(self, nodeid, marks=(), path=""):
            self.nodeid, self.marks, self.path = nodeid, marks, path

        def get_closest_marker(self, name):
            return name if name in self.marks else None

    assert "JupyterLab in Chromium" in long_stretch(Item("tests/test_browser.py::t", ["browser"]))
    assert "with its exercises solved" in long_stretch(Item("t", ["solutions"]))
    assert long_stretch(Item("tests/test_tape.py::t")) is None
    first = long_stretch(Item("n::Cell 0", path=str(ROOT / "notebooks" / "05_mlp.ipynb")))
    assert first == "notebooks/05_mlp.ipynb: every cell executed by nbval" or "05_mlp" in first
    assert long_stretch(Item("n::Cell 1", path=str(ROOT / "notebooks" / "05_mlp.ipynb"))) is None

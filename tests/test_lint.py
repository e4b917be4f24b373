"""ruff, configured in pyproject.toml (line length 110, pyflakes, pycodestyle, import order,
bugbear, pyupgrade), passes over the package, the tests, the benchmarks and the notebooks' code
cells (ruff reads .ipynb itself; pyproject says what notebooks may do that modules may not)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def ruff() -> list[str]:
    """The ruff installed beside this Python (the test extra), else one on PATH."""
    beside = Path(sys.executable).parent / "ruff"
    if beside.exists():
        return [str(beside)]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.skip('ruff is not installed; install the test extra with `pip install -e ".[test]"`')


def test_ruff_passes():
    run = subprocess.run([*ruff(), "check", "--output-format", "concise", "smallem", "tests",
                          "benchmarks", "notebooks"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        pytest.fail(f"ruff found problems (`ruff check --fix` repairs some):\n{run.stdout}{run.stderr}",
                    pytrace=False)

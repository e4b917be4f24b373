"""Loaded by every pytest run here, tests and notebooks alike: the learner's data folder points at a
temporary one, set at import time so nbval's kernels inherit it, and no run ever writes the real
user's progress file."""

import atexit
import os
import shutil
import tempfile

os.environ["SMALLEM_HOME"] = tempfile.mkdtemp(prefix="smallem-test-home-")
atexit.register(shutil.rmtree, os.environ["SMALLEM_HOME"], ignore_errors=True)

# nbval waits 5 s for each output message after a cell's reply (a fixed attribute, no option);
# on a busy 2-core machine the kernel's output thread can stall longer than that after a long
# cell (05's 2,000-step dashboard cell failed so at a load of 6: "Timeout of 5 seconds exceeded
# waiting for output"). Only a hang may fail a test: an hour, as every other notebook limit here.
OUTPUT_WAIT_SECONDS = 3600  # tests/run_cells_twice.py HANG_SECONDS


def pytest_collection_modifyitems(items):
    for item in items:
        if hasattr(item, "output_timeout"):  # nbval's IPyNbCell
            item.output_timeout = OUTPUT_WAIT_SECONDS


# The long stretches say what they are doing, on the terminal whatever the capture or -q: a run
# that sits for minutes on one test names it and why (README: how long the run takes, and where).
LONG = {"browser": "JupyterLab in Chromium", "solutions": "a lesson run with its exercises solved",
        "portability": "the wheel or the sdist, built and used outside this folder"}
_announced: set[str] = set()


def long_stretch(item) -> str | None:
    """What a long test is doing, or None for a quick one."""
    mark = next((m for m in LONG if item.get_closest_marker(m)), None)
    if mark is not None:
        return f"{item.nodeid}: {LONG[mark]}"
    path = str(getattr(item, "path", ""))
    if path.endswith(".ipynb") and path not in _announced:  # nbval: one line per notebook
        _announced.add(path)
        return f"{os.path.relpath(path)}: every cell executed by nbval"
    return None


def pytest_runtest_setup(item):
    said = long_stretch(item)
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")
    if said and reporter is not None and not item.config.getoption("verbose") > 0:
        reporter.ensure_newline()
        reporter.write_line(f"... {said}")

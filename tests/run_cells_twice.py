"""Run one notebook with each code cell executed twice in a row, as a learner who presses
Shift-Enter twice does; used by test_portability.py under a venv holding smallem's wheel.

usage: python run_cells_twice.py NOTEBOOK   (exit 1 naming the notebook and cell on a traceback)
"""

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

# A cell (or a kernel's start) this long is stuck, not slow: the only limit the notebook tests
# set, far above what a busy machine needs (06's training cell: 19 s idle, some 10x that while
# other work keeps both cores busy). pyproject's nbval options say the same number.
HANG_SECONDS = 3600


def main(path: Path) -> int:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=HANG_SECONDS, startup_timeout=HANG_SECONDS, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start, took = time.perf_counter(), {}
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or "nbval-skip" in cell.metadata.get("tags", []):
                continue
            for run in ("first", "second"):
                began = time.perf_counter()
                try:
                    client.execute_cell(cell, index)
                    took[(index, run)] = time.perf_counter() - began
                except CellExecutionError as error:
                    last = [line for line in str(error).splitlines() if line.strip()][-1:]
                    print(f"{path.name}: cell {index} failed on its {run} run: "
                          f"{' '.join(last)}\n--- the cell ---\n{cell.source}\n--- the error ---\n"
                          f"{error}", file=sys.stderr)
                    return 1
    slowest = sorted(took.items(), key=lambda kv: -kv[1])[:3]
    print(f"{path.name}: every code cell ran twice in {time.perf_counter() - start:.1f} s; "
          "slowest: " + ", ".join(f"cell {i} ({run}) {s:.1f} s" for (i, run), s in slowest))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

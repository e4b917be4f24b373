"""Run a notebook's code cells as a plain script, for machines without Jupyter (the GPU box).

benchmarks/gpu_session.sh (its notebooks stage) runs the notebooks' GPU branches with it on the
lent device, where nbval and JupyterLab are not installed: every code cell runs in one
namespace, in order, its asserts included; a failing cell stops the run with its number.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

import matplotlib

matplotlib.use("Agg")


def run(path: str) -> bool:
    cells = [c for c in json.load(open(path))["cells"] if c["cell_type"] == "code"]
    namespace: dict = {"__name__": "__main__",
                       "display": lambda *objs, **kw: [print(repr(o)[:300]) for o in objs]}
    start = time.perf_counter()
    for k, cell in enumerate(cells, 1):
        source = "".join(cell["source"])
        try:
            exec(compile(source, f"{path}#cell{k}", "exec"), namespace)
        except Exception:
            traceback.print_exc()
            print(f"FAILED {path}: code cell {k}")
            return False
    print(f"PASSED {path}: {len(cells)} code cells in {time.perf_counter() - start:.1f} s")
    return True


if __name__ == "__main__":
    results = [run(p) for p in sys.argv[1:]]
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if all(results) else 1)

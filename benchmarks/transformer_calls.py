"""The backend calls of one Transformer training step on the GPU (each at least one kernel
launch): with the fused kernels, without them (every reference rule), and what a captured step
launches instead (one graph). Written as JSON for notebook 10's Transformer section.

    python benchmarks/transformer_calls.py [JSON]
"""

from __future__ import annotations

import json
import sys

from smallem.backends import gpu_available
from smallem.tools.bench import NO_LAUNCH, step_calls


def main() -> None:
    backend = "gpu" if gpu_available() else "cpu"
    out: dict = {"backend": backend}
    for fused in (True, False):
        calls, seconds = step_calls(backend, model="transformer", fused=fused)
        launching = {k: v for k, v in calls.items() if k not in NO_LAUNCH}
        key = "fused" if fused else "unfused"
        out[f"{key}_calls"] = sum(launching.values())
        out[f"{key}_host_ms"] = round(1e3 * sum(seconds[k] for k in launching), 3)
        out[f"{key}_by_call"] = dict(sorted(launching.items(), key=lambda kv: -kv[1]))
    out["captured_launches"] = 1  # the graph; plus one host-to-device copy of the batch
    print(json.dumps({k: v for k, v in out.items() if not k.endswith("_by_call")}, indent=1))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()

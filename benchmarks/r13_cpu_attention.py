"""The float32 CPU's fused causal attention alone (forward and rule, one tape), at bench's CPU
size (batch 64, 4 heads, context 64, head width 16), on a team of N threads: to tell how its
routes scale (round 13, issue 38). The route is the environment's (SMALLEM_KERNELS=numpy:
NumPy's calls; on the pool from 16 threads; round 13 also read SMALLEM_ATTENTION_ROWS, the
queries of one sgemm, deleted in round 14).

    python benchmarks/r13_cpu_attention.py THREADS [REPS]   one JSON line: median ms and p10-p90
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from smallem.autodiff import Tape, attention
from smallem.backends import get_backend
from smallem.backends.cpu import compiled, settle, team


def timed(threads: int, reps: int = 20) -> dict:
    """ms of one attention forward and rule, median and p10-p90 of `reps` after 3."""
    os.environ["SMALLEM_THREADS"] = str(threads)
    cpu = get_backend("cpu")
    settle()
    rng = np.random.default_rng(0)
    b, h, t, d = 64, 4, 64, 16
    raw = [rng.normal(size=(b, t, h, d)).astype(np.float32) for _ in range(3)]
    grad = rng.normal(size=(b, h, t, d)).astype(np.float32)

    def run() -> None:
        tape = Tape(cpu)
        leaves = [tape.leaf(r.transpose(0, 2, 1, 3)) for r in raw]  # the heads' split views
        tape.backward(attention(tape, *leaves, causal=True), grad=grad)

    for _ in range(3):
        run()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    p10, p50, p90 = (round(1e3 * float(v), 3) for v in np.percentile(times, [10, 50, 90]))
    return {"threads": team.size(), "blas": bool(compiled.attention_blas()), "ms": p50,
            "p10": p10, "p90": p90, "cpus": len(os.sched_getaffinity(0))}


if __name__ == "__main__":
    print(json.dumps(timed(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 20)),
          flush=True)

"""Lesson 15's recorded GPU data: the longest context that fits a memory budget, before and after.

The default Transformer (width 128, 2 blocks, 4 heads) on one window of T bytes, forward +
backward on the GPU, unfused, fused, fused with checkpointed blocks: the tape's own peak, the
device memory a fresh pool grew to, and the time. Writes memory_h200.json (into $OUT, or the
folder given), which recorded/ beside this file ships. Run on a GPU:
`python3 -m smallem.course.l15_memory.record [DIR]` (benchmarks/memory_record_gpu.py runs it too).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import cupy
import numpy as np

from smallem.autodiff import Tape
from smallem.backends import get_backend
from smallem.data import VOCAB
from smallem.models.transformer import Transformer, TransformerConfig

BUDGET_GIB = 4
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
CONFIGS = {"unfused": {"attention": "unfused"}, "fused": {"attention": "fused"},
           "fused + checkpointed": {"attention": "fused", "checkpoint_blocks": True}}


def measure(be, t: int, kw: dict) -> dict:
    model = Transformer(TransformerConfig(context=t, **kw), be, seed=0)
    rng = np.random.default_rng(t)
    x, y = rng.integers(0, VOCAB, (1, t)), rng.integers(0, VOCAB, (1, t))

    def step():
        tape = Tape(be)
        tape.backward(model.loss(tape, x, y))
        return tape

    pool = cupy.cuda.MemoryPool()
    try:
        with cupy.cuda.using_allocator(pool.malloc):
            tape = step()  # compiles, uploads the constants, grows the pool to what one step needs
            be.synchronize()
            report = tape.memory()
            device = pool.total_bytes()
            del tape
            times = []
            for _ in range(3):
                be.synchronize()
                start = time.perf_counter()
                step()
                be.synchronize()
                times.append(1e3 * (time.perf_counter() - start))
    except cupy.cuda.memory.OutOfMemoryError:
        pool.free_all_blocks()
        return {"T": t, "oom": True}
    pool.free_all_blocks()
    return {"T": t, "kept": report.kept, "tape_peak": report.peak, "device_bytes": int(device),
            "ms": statistics.median(times), "oom": False}


def main() -> None:
    be = get_backend("gpu")
    out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", ".")
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    rows: dict = {}
    budget = BUDGET_GIB * 2**30
    for label, kw in CONFIGS.items():
        rows[label] = []
        for t in LENGTHS:
            r = measure(be, t, kw)
            rows[label].append(r)
            print(label, r, flush=True)
            if r["oom"] or r["device_bytes"] > 4 * budget:
                break  # longer ones only need more
    longest = {}
    for label, found in rows.items():
        fit = [r for r in found if not r["oom"] and r["device_bytes"] <= budget]
        best = max(fit, key=lambda r: r["T"])
        longest[label] = {"T": best["T"], "device_gib": best["device_bytes"] / 2**30,
                          "ms": best["ms"], "largest_tried": max(r["T"] for r in found)}
    result = {"machine": f"{name}, CuPy {cupy.__version__}", "budget_gib": BUDGET_GIB,
              "model": "Transformer width 128, 2 blocks, 4 heads, one window (B = 1), float32",
              "measured": "device_bytes: a fresh CuPy pool's size after one forward + backward "
                          "(parameters not included); tape_peak: tape.memory().peak",
              "rows": rows, "longest": longest}
    with open(os.path.join(out, "memory_h200.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(longest, indent=1))


if __name__ == "__main__":
    main()

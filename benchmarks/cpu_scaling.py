"""Why the float32 CPU step does not scale with threads, and which setting of the team does best:
smallem's Transformer step (bench's CPU size) under several settings in one process, a step of
each in turn, and what one team.run costs. Round 7 (issue 38); run on the device host by
benchmarks/cpu_scaling_device.sh.

    python benchmarks/cpu_scaling.py sweep ROUNDS    settings side by side, medians (one JSON line)
    python benchmarks/cpu_scaling.py overhead        team.run's cost: empty pieces, small adds
    python benchmarks/cpu_scaling.py gemm            the step's GEMM shapes on one thread, and the
                                                     kernels OpenBLAS chose for this CPU

The team's size is SMALLEM_THREADS (or the machine's choice). A setting: GRAIN (team.GRAIN: a
run wakes one thread per GRAIN units of its work), the GIL's switch interval, and the attention
(unfused, or backends/cpu/attention.py). Neither GRAIN nor the interval changes a bit of the step
(checked here: the losses of every setting with the same attention must match, and "losses"
compares them across processes). Round 7's device call ran this file at commit 68d3c97, with two
more kinds of setting since dropped: BLAS's own threads taking the 2-D products (slower, and not
the same bits) and helpers woken as a tree (no faster).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace

import numpy as np

from smallem.backends import get_backend
from smallem.backends.cpu import team, threads
from smallem.optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
from smallem.training import registry
from smallem.training.step import make_step

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from cpu_step import batches  # noqa: E402  (beside this file)

# CPU_CLOCK=1: this process's CPU time (one thread on a busy machine: what a step costs), else wall
CLOCK = time.process_time if os.environ.get("CPU_CLOCK") else time.perf_counter
SETTINGS = {  # name: (GRAIN, the GIL's switch interval in s (None: Python's), attention)
    "grain 1, unfused (round 6)": (1, None, "unfused"),
    "grain 4, unfused": (4, None, "unfused"),
    "grain 1, fused": (1, None, "fused"),
    "grain 2, fused": (2, None, "fused"),
    "grain 4, fused": (4, None, "fused"),
    "grain 8, fused": (8, None, "fused"),
    "grain 16, fused": (16, None, "fused"),
    "grain 32, fused": (32, None, "fused"),
    "grain 4, fused, switch 0.1 ms": (4, 1e-4, "fused"),
    "grain 8, fused, switch 0.1 ms": (8, 1e-4, "fused"),
}


def apply(grain: float, switch: float | None, attention: str, default_switch: float) -> None:
    team.GRAIN = grain
    sys.setswitchinterval(switch or default_switch)


def sweep(rounds: int, names: list[str] | None = None) -> dict:
    """Each setting's median step (ms) at this team size, a step of each in turn, every round."""
    be = get_backend("cpu")
    threads.settle()
    chosen = {k: v for k, v in SETTINGS.items() if not names or k in names}
    data, default_switch = batches(), sys.getswitchinterval()
    models = {}
    for name, setting in chosen.items():  # one model each, all from the same seed: same bits
        config = replace(registry.get("transformer").bench_config("cpu"), attention=setting[2])
        model = registry.get("transformer").build(config, be, 0)
        models[name] = make_step(be, model, AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY))
    times: dict[str, list[float]] = {name: [] for name in chosen}
    losses: dict[str, list[float]] = {name: [] for name in chosen}
    began, limit = time.perf_counter(), float(os.environ.get("SWEEP_SECONDS", "40"))
    for k in range(rounds + 2):  # two warm-up rounds; past `limit` seconds, no more rounds
        if k > 2 and time.perf_counter() - began > limit:
            break
        for name, step in models.items():
            apply(*chosen[name], default_switch)
            start = CLOCK()
            loss = step(*data[k % len(data)])
            spent = CLOCK() - start
            losses[name].append(float(np.asarray(loss if not isinstance(loss, tuple) else loss[0])))
            if k >= 2:
                times[name].append(spent)
    apply(team.GRAIN, None, "unfused", default_switch)
    from threadpoolctl import threadpool_info

    pools = {f"{lib['internal_api']} {lib.get('threading_layer', '')}".strip(): lib["num_threads"]
             for lib in threadpool_info()}  # BLAS held to one thread when the team splits
    same = {a: len({tuple(v) for k, v in losses.items() if chosen[k][2] == a}) == 1
            for a in {s[2] for s in chosen.values()}}
    firsts = {s[2]: losses[k] for k, s in chosen.items()}
    gap = (max(abs(a - b) for a, b in zip(firsts["unfused"], firsts["fused"]))
           if len(firsts) == 2 else None)
    return {"threads": team.size(), "rounds": len(next(iter(times.values()))), "thread pools": pools,
            "same bits (by attention)": same,
            "fused against unfused: largest loss gap": gap,
            "losses": {a: [float(x).hex() for x in v] for a, v in firsts.items()},  # across processes
            **{name: round(1e3 * float(np.median(t)), 2) for name, t in times.items()}}


def overhead(repeats: int = 200) -> dict:
    """µs per team.run of 16 pieces: empty ones, and adds of 16 × 64K floats (1 M), by team size."""
    out = {}
    a, b = np.ones((1 << 20,), np.float32), np.ones((1 << 20,), np.float32)
    c = np.empty_like(a)
    cut = team.spans(a.size, 16)
    for n in (1, 2, 4, 8, 16):
        team.resize(n)
        for label, fn in (("empty", lambda s: None), ("add 1M", lambda s: np.add(a[s], b[s], out=c[s]))):
            for _ in range(10):
                team.run(fn, cut)
            start = time.perf_counter()
            for _ in range(repeats):
                team.run(fn, cut)
            out[f"{label}, {n} threads"] = round(1e6 * (time.perf_counter() - start) / repeats, 1)
    team.resize(1)
    return out


def gemm(repeats: int = 50) -> dict:
    """ms of the step's products on one thread (BLAS's own), and OpenBLAS's kernel family: a
    virtual machine that hides its CPU's model can leave OpenBLAS on an older family's kernels."""
    from threadpoolctl import threadpool_info, threadpool_limits

    threadpool_limits(1, user_api="blas")
    out: dict = {lib["internal_api"]: lib.get("architecture") for lib in threadpool_info()}
    rng = np.random.default_rng(0)
    for m, k, n in ((4096, 64, 64), (4096, 64, 256), (4096, 256, 64), (4096, 64, 257), (64, 4096, 64)):
        a, b = rng.normal(size=(m, k)).astype(np.float32), rng.normal(size=(k, n)).astype(np.float32)
        a @ b
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        spent = (time.perf_counter() - start) / repeats
        out[f"{m}x{k}x{n} ms"] = round(1e3 * spent, 3)
        out[f"{m}x{k}x{n} GFLOP/s"] = round(2 * m * k * n / spent / 1e9, 1)
    return out


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "sweep"
    if what == "sweep":
        print(json.dumps(sweep(int(sys.argv[2]) if len(sys.argv) > 2 else 8, sys.argv[3:] or None)),
              flush=True)
    elif what == "gemm":
        print(json.dumps(gemm()), flush=True)
    else:
        print(json.dumps(overhead()), flush=True)

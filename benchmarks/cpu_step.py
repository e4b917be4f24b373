"""The small Transformer's CPU step (bench's CPU size, float32) against PyTorch's, and where it goes.

    python benchmarks/cpu_step.py pair [ROUNDS]      smallem cpu and PyTorch eager, one step each in turn
    python benchmarks/cpu_step.py cpu-time [ROUNDS]  the same in CPU time (for one thread)
    python benchmarks/cpu_step.py ops [STEPS]        smallem's step split by operation, forward and rule
    python benchmarks/cpu_step.py ops-cpu-time [STEPS]  the same in CPU time
    python benchmarks/cpu_step.py linears [STEPS]    the step's Linears by shape at one thread, CPU
                                                     time: as the step calls them, replayed at once,
                                                     their pieces alone, one NumPy call each (round 15)
    python benchmarks/cpu_step.py torch-ops [STEPS]  PyTorch SDPA's step by op (torch.profiler, self time)
    python benchmarks/cpu_step.py alone NAME [STEPS] one row of bench ("smallem cpu", "PyTorch eager",
                                                     "PyTorch eager, SDPA") alone in this process
                                                     (ALONE_OPS=1: then `ops` in the same process)

`pair` prints each side's median and the median of the per-round ratios (a machine shared with
other work slows both sides of a round alike); run it with OMP_NUM_THREADS set, as bench is.
`ops` times every tape primitive and operation's forward and rule by name (cumulative: nested
calls are counted once, in the outermost), with the minor page faults each took.
"""

from __future__ import annotations

import collections
import json
import sys
import time
from collections.abc import Callable

import numpy as np

from smallem.autodiff.tape import Tape
from smallem.backends import get_backend
from smallem.backends.cpu import minor_faults
from smallem.data import load_corpus
from smallem.optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
from smallem.tools import bench
from smallem.tools.bench import build, sequence_batches
from smallem.training import registry
from smallem.training.step import make_step


def batches(count: int = 16) -> list:
    """The batches bench times the CPU rows on: the registry's batch and CPU size."""
    entry = registry.get("transformer")
    return sequence_batches(load_corpus().train, entry.batch, entry.bench_config("cpu").context,
                            count, 0)


def pair(rounds: int, clock: Callable[[], float] = time.perf_counter) -> dict:
    """Medians of smallem's and PyTorch's CPU step, timed in turn, and their paired ratio.
    `clock`: wall time, or time.process_time (this process's CPU time: on one thread, what a
    step costs whatever else the machine runs)."""
    chosen = [c for c in bench.transformer_candidates(True) if c[1] == "cpu"]
    data, impls = batches(), {name: factory(0) for name, _, _, factory in chosen}
    times: dict[str, list[float]] = {name: [] for name in impls}
    for step, _, _ in impls.values():
        for b in data[:3]:
            step(*b)  # warm-up: first allocations, the optimizer's moments
    for k in range(rounds):
        for name, (step, sync, _) in impls.items():
            start = clock()
            step(*data[k % len(data)])
            sync()
            times[name].append(clock() - start)
    out = {name: round(1e3 * float(np.median(t)), 2) for name, t in times.items()}
    if "PyTorch eager" in times:
        ratios = np.array(times["smallem cpu"]) / np.array(times["PyTorch eager"])
        out["paired ratio"] = round(float(np.median(ratios)), 3)
    return out


def alone(name: str, steps: int) -> dict:
    """One row's step timed with nothing else in the process, as `smallem bench` now times each
    CPU row (bench._time_row, in its spawned child): median and p10-p90 of single steps, ms."""
    import os

    times, _, info = bench._time_row("transformer", name, batches(), (3, steps, 1), 0)
    p10, p50, p90 = (round(1e3 * float(v), 2) for v in np.percentile(times, [10, 50, 90]))
    out = {"row": name, "ms": p50, "p10": p10, "p90": p90, "steps": steps,
           "threads": info["threads"], "faults": info["faults"], "cpus": len(os.sched_getaffinity(0)),
           "load": round(os.getloadavg()[0], 2)}
    if os.environ.get("ALONE_OPS") and name.startswith("smallem"):  # round 15: is a slow process
        out["ops after, same process"] = ops(8)  # slow in every op, or in some?
    return out


def _warm_step() -> tuple[Callable, AdamW, list]:
    """bench's CPU step of the Transformer (step, its optimizer, the batches), run 3 times."""
    be = get_backend("cpu")
    model = build("transformer", be, 0, "cpu")
    optimizer = AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY)
    step = make_step(be, model, optimizer)
    data = batches()
    for b in data[:3]:
        step(*b)
    return step, optimizer, data


def ops(steps: int, clock: Callable[[], float] = time.perf_counter) -> dict:
    """Milliseconds per step of each primitive's and operation's forward and rule."""
    step, optimizer, data = _warm_step()
    spent: dict[str, float] = collections.defaultdict(float)
    faulted: dict[str, float] = collections.defaultdict(float)  # minor page faults, by the same keys
    update = optimizer.step

    def timed_update(*args, **kwargs):  # the optimizer's update (AdamW over every parameter)
        start = clock()
        try:
            return update(*args, **kwargs)
        finally:
            spent["optimizer"] += clock() - start

    optimizer.step = timed_update
    depth = [0]

    def timed(name, fn):
        def wrapper(self, *args, **kwargs):
            depth[0] += 1
            faults, start = minor_faults() or 0, clock()
            try:
                return fn(self, *args, **kwargs)
            finally:
                depth[0] -= 1
                if not depth[0]:
                    key = args[0].name if name == "apply" else name
                    spent[f"forward {key}"] += clock() - start
                    faulted[f"forward {key}"] += (minor_faults() or 0) - faults
        return wrapper

    originals = {}
    for name in ("add", "sub", "mul", "div", "matmul", "transpose", "reshape", "gelu",
                 "gather_rows", "apply"):
        originals[name] = getattr(Tape, name)
        setattr(Tape, name, timed(name, originals[name]))
    rule = originals["local_gradients"] = Tape.local_gradients

    def local_gradients(self, node, grad):
        faults, start = minor_faults() or 0, clock()
        try:
            return rule(self, node, grad)
        finally:
            spent[f"rule {node.op}"] += clock() - start
            faulted[f"rule {node.op}"] += (minor_faults() or 0) - faults

    Tape.local_gradients = local_gradients
    try:
        faults, start = minor_faults() or 0, clock()
        for k in range(steps):
            step(*data[k % len(data)])
        total, faults = clock() - start, (minor_faults() or 0) - faults
    finally:
        for name, fn in originals.items():
            setattr(Tape, name, fn)
    rows = {k: round(1e3 * v / steps, 2) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}
    return {"step ms": round(1e3 * total / steps, 2),
            "rest ms (tape, Python)": round(1e3 * total / steps - sum(rows.values()), 2),
            **rows, "faults a step": round(faults / steps, 1),
            "faults a step by operation": {k: round(v / steps, 1) for k, v in faulted.items() if v}}


def linears(steps: int, reps: int = 30) -> list[dict]:
    """The step's Linears at one thread in this thread's CPU time, ms a step by (rule or
    forward, shape), each a call's median times its calls a step: as the step called them; the
    same call replayed at once (its inputs hot);
    its pieces alone as NumPy calls (the engine's cut: dx's rows, dW's slices and their sum in
    order, db's pieces; the forward's rows); one NumPy call of each product (and db's sum) alone
    (r15_cpu_gemm.py's rows). Round 15: the step's Linears took ~13 ms more than their products
    timed alone on one host core; these columns say which part of the way it is lost."""
    import os

    from smallem.backends.cpu import linear, team
    from smallem.backends.cpu.products import _sum_in_order

    os.environ["SMALLEM_THREADS"] = "1"
    step, _, data = _warm_step()
    team.resize(1)
    clock, keys = time.thread_time, collections.defaultdict(lambda: collections.defaultdict(list))
    calls: dict = {}
    originals = {"_forward": linear._forward, "_rule": linear._rule}

    def timed(name):
        fn = originals[name]

        def wrapper(*args):
            a, w = args[0], args[2 if name == "_rule" else 1]
            key = f"{name[1:]} {a.size // a.shape[-1]}x{w.shape[0]} @ {w.shape[0]}x{w.shape[1]}"
            if name == "_forward" and args[3] is not None:
                key += " + r"
            start = clock()
            out = fn(*args)
            keys[key]["in step"].append(clock() - start)
            start = clock()
            fn(*args)
            keys[key]["replayed"].append(clock() - start)
            calls[key] = args
            return out
        return wrapper

    for name in originals:
        setattr(linear, name, timed(name))
    try:
        for k in range(steps):
            step(*data[k % len(data)])
    finally:
        for name, fn in originals.items():
            setattr(linear, name, fn)

    def median_ms(fn) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            start = clock()
            fn()
            times.append(clock() - start)
        return 1e3 * float(np.median(times))

    out = []
    for key, got in sorted(keys.items()):
        args, n = calls[key], len(got["in step"]) / steps
        if key.startswith("forward"):
            x, w, b, r = args
            plan = linear._cut(x, w, b)
            rows, cut = plan.rows, plan.cut
            x2, y = x.reshape(rows, w.shape[0]), np.empty((rows, w.shape[1]), np.float32)
            alone = {"pieces": lambda: [np.matmul(x2[s], w, out=y[s]) for s in cut],
                     "one call": lambda: np.matmul(x2, w, out=y)}
        else:
            g, x, w, b = args
            plan, (k, m) = linear._cut(x, w, b), w.shape
            rows, cut, jobs = plan.rows, plan.cut, plan.jobs
            x2, g2, grads = x.reshape(rows, k), g.reshape(rows, m), g.reshape(g.shape[0], -1)
            dx = np.empty((rows, k), np.float32)
            dws = [s for kind, s in jobs if kind == "dw sum"]
            alone = {"dx pieces": lambda: [np.matmul(g2[s], w.T, out=dx[s]) for s in cut],
                     "dW pieces": lambda: dws and _sum_in_order([x2[s].T @ g2[s] for s in dws]),
                     "db pieces": lambda: [grads[s].sum(0) for kind, s in jobs if kind == "db"],
                     "dx one call": lambda: np.matmul(g2, w.T, out=dx),
                     "dW one call": lambda: x2.T @ g2, "db one call": lambda: g2.sum(0)}
        engine = originals["_forward" if key.startswith("forward") else "_rule"]
        row = {"Linear": key, "calls a step": n, "in step": n * 1e3 * float(np.median(got["in step"])),
               "replayed": n * 1e3 * float(np.median(got["replayed"])),
               "engine alone": n * median_ms(lambda: engine(*args))}
        row.update({name: n * median_ms(fn) for name, fn in alone.items()})
        out.append({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
    total = collections.defaultdict(float)
    for row in out:
        for k, v in row.items():
            if k not in ("Linear", "calls a step"):
                total[f"{row['Linear'].split()[0]}s {k}"] += v
    out.append({"Linear": "all", **{k: round(v, 2) for k, v in total.items()},
                "load": round(os.getloadavg()[0], 2)})
    return out


def torch_ops(steps: int) -> dict:
    """PyTorch SDPA's CPU step (bench's row) by aten op: ms a step of each op's self time on the
    calling thread (an op split over intra-op threads counts its wall time, as `ops` does), the
    step unprofiled beside; to compare with `ops` op by op."""
    from torch.profiler import ProfilerActivity, profile

    name = "PyTorch eager, SDPA"
    factory = next(c[3] for c in bench.transformer_candidates(True) if c[0] == name and c[1] == "cpu")
    step, sync, _ = factory(0)
    data = batches()
    for b in data[:3]:
        step(*b)
    sync()
    start = time.perf_counter()
    for k in range(steps):
        step(*data[k % len(data)])
    sync()
    plain = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for k in range(steps):
            step(*data[k % len(data)])
        sync()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    spent = {e.key: round(e.self_cpu_time_total / 1e3 / steps, 3) for e in rows[:40]}
    return {"row": name, "step ms": round(1e3 * plain / steps, 2),
            "profiled, self ms a step": round(sum(e.self_cpu_time_total for e in rows) / 1e3 / steps, 2),
            "calls a step": round(sum(e.count for e in rows) / steps, 1), **spent}


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "pair"
    if what == "alone":
        print(json.dumps(alone(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 30)), flush=True)
        sys.exit()
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    result = {"pair": lambda: pair(count), "cpu-time": lambda: pair(count, time.process_time),
              "ops": lambda: ops(count), "torch-ops": lambda: torch_ops(count),
              "ops-cpu-time": lambda: ops(count, time.process_time),
              "linears": lambda: linears(count)}[what]()
    for line in result if isinstance(result, list) else [result]:
        print(json.dumps(line), flush=True)

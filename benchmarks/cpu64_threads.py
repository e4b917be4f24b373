"""The float64 route's work at BLAS 1 thread against N, interleaved in one process (round 15).

usage: python benchmarks/cpu64_threads.py ROUNDS OUT.json [N]   (N: default, every usable CPU)

What one BLAS thread costs cpu64 where OpenBLAS's threads could help (an idle machine): notebook
13's MLP race (400 steps) and Transformer race (20 steps), notebook 09's 100 AdamW steps of the
default MLP (batch 64), and 20 steps at `smallem train`'s batch 256. Each piece runs once per
round at each setting, the settings interleaved so that the machine's load falls on both alike;
min and median per setting, the load average beside each round, and the last loss of each run
(one thread against N: whether the bits differ).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

from smallem import Tape
from smallem.course.l13_your_engine import capstone, your_transformer
from smallem.data import BatchSampler, load_corpus
from smallem.models import Mlp
from smallem.optim import AdamW


def mlp_steps(corpus, batch: int, steps: int) -> float:
    model = Mlp(backend="cpu64", seed=0)
    optimizer, sampler = AdamW(lr=3e-3), BatchSampler(corpus.train, batch=batch, seed=0)
    for _ in range(steps):
        tape = Tape("cpu64")
        loss = model.loss(tape, *sampler.next())
        optimizer.step(model.parameters(), tape.backward(loss))
    return float(loss.value)


def main(rounds: int, out: str, n: int) -> None:
    corpus = load_corpus()
    work = {
        "13 MLP race (400 steps)": lambda: capstone.race(
            corpus=corpus, progress_bar=False, log=None).yours[-1],
        "13 Transformer race (20 steps)": lambda: your_transformer.race(
            corpus=corpus, steps=20, progress_bar=False, log=None).yours[-1],
        "09 MLP, batch 64, 100 steps": lambda: mlp_steps(corpus, 64, 100),
        "train's MLP, batch 256, 20 steps": lambda: mlp_steps(corpus, 256, 20),
    }
    times = {name: {1: [], n: []} for name in work}
    last = {name: {1: set(), n: set()} for name in work}
    loads = []
    for r in range(rounds):
        for name, run in work.items():
            for threads in (1, n):
                with threadpool_limits(threads, user_api="blas"):
                    start = time.perf_counter()
                    last[name][threads].add(repr(float(run())))
                    times[name][threads].append(time.perf_counter() - start)
        loads.append(os.getloadavg()[0])
        print(f"round {r + 1}: load {loads[-1]:.2f}", flush=True)
    rows = []
    for name in work:
        t = times[name]
        rows.append({"work": name, "min_1": min(t[1]), "median_1": float(np.median(t[1])),
                     f"min_{n}": min(t[n]), f"median_{n}": float(np.median(t[n])),
                     "last_loss_1": sorted(last[name][1]), f"last_loss_{n}": sorted(last[name][n])})
        print(f"{name:34s} 1 thread: min {min(t[1]):6.2f} s, median {np.median(t[1]):6.2f} | {n} threads: "
              f"min {min(t[n]):6.2f} s, median {np.median(t[n]):6.2f} | losses {rows[-1]['last_loss_1']} "
              f"{rows[-1][f'last_loss_{n}']}")
    with open(out, "w") as f:
        json.dump({"threads": [1, n], "rounds": rounds, "loads": loads, "times": {
            name: {str(k): v for k, v in t.items()} for name, t in times.items()}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    n = int(sys.argv[3]) if len(sys.argv) > 3 else len(os.sched_getaffinity(0))
    main(int(sys.argv[1]), sys.argv[2], n)

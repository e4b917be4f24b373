"""The CPU rows of `smallem bench`, each timed in a process of its own (tools/bench.py calls it).

Timed in turn inside one process, a NumPy row and a PyTorch row share the host with each other's
thread pools (OpenBLAS's and OpenMP's threads spin for a while after every call): on the H200
host's 16 cores PyTorch's Transformer step took 137 ms in turn with smallem's and 18 ms alone
(benchmarks/results/round5/). So each row runs alone in a fresh interpreter, the rows one after
another, in two rounds (A B C A B C: a host that gets busier halfway slows every row alike).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

ROUNDS = 2


@contextmanager
def _no_gpu():
    """Children see no GPU: a CPU row never needs one, and CUDA's start would only cost time."""
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def time_rows(time_row: Callable, model: str, names: list[str], batches: list,
              plan: tuple[int, int, int], seed: int = 0) -> dict[str, tuple[list[float], Any]]:
    """Seconds per step of every timed block, and the last loss, of each CPU row in `names`:
    each row in a fresh process per round, `plan` = (warmup, steps, block) split over the rounds.
    `time_row(model, name, batches, plan, seed)` times one row there (bench._time_row: a
    module-level function, so the child imports it by name)."""
    warmup, steps, block = plan
    blocks = max(1, steps // block)  # as the table's title counts them, shared out over the rounds
    rounds = [blocks // ROUNDS + (r < blocks % ROUNDS) for r in range(ROUNDS)]
    out: dict[str, tuple[list[float], Any]] = {name: ([], None) for name in names}
    context = multiprocessing.get_context("spawn")  # a new interpreter: its own thread pools
    with _no_gpu(), context.Pool(1, maxtasksperchild=1) as pool:  # a fresh process per row and round
        for count in (n for n in rounds if n):
            for name in names:
                seconds, loss = pool.apply(time_row, (model, name, batches, (warmup, count * block, block),
                                                       seed))
                out[name] = (out[name][0] + seconds, loss)
    return out

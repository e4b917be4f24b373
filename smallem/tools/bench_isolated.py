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
              plan: tuple[int, int, int], seed: int = 0) -> dict[str, tuple[list[float], Any, dict]]:
    """Seconds per step of every timed block, the last loss, and {"threads", "faults"} (the
    last round's: threads it ran on, minor page faults per step) of each CPU row in `names`:
    each row in a fresh process per round, `plan` = (warmup, steps, block) split over the rounds.
    `time_row(model, name, batches, plan, seed)` times one row there (time_row below: a
    module-level function, so the child imports it by name)."""
    warmup, steps, block = plan
    blocks = max(1, steps // block)  # as the table's title counts them, shared out over the rounds
    rounds = [blocks // ROUNDS + (r < blocks % ROUNDS) for r in range(ROUNDS)]
    out: dict[str, tuple[list[float], Any, dict]] = {name: ([], None, {}) for name in names}
    context = multiprocessing.get_context("spawn")  # a new interpreter: its own thread pools
    with _no_gpu(), context.Pool(1, maxtasksperchild=1) as pool:  # a fresh process per row and round
        for count in (n for n in rounds if n):
            for name in names:
                seconds, loss, info = pool.apply(time_row, (model, name, batches,
                                                            (warmup, count * block, block), seed))
                out[name] = (out[name][0] + seconds, loss, info)
    return out


def time_row(model: str, name: str, batches: list, plan: tuple[int, int, int],
              seed: int) -> tuple[list[float], float, dict[str, Any]]:
    """In the child process: build CPU row `name` (bench's candidates), warm it up, time its blocks.
    Also returns {"threads": what it ran on, "faults": minor page faults per timed step}."""
    from ..backends.cpu import minor_faults, settle
    from .bench import Runner, candidates, transformer_candidates

    pool = transformer_candidates(True) if model == "transformer" else candidates(True, True)
    step, synchronize, read = next(c[3] for c in pool if c[0] == name and c[1] == "cpu")(seed)
    if name.startswith("smallem"):
        settle()  # this run's threads, decided now (SMALLEM_THREADS, --threads, or the machine)
    runner = Runner(step, synchronize, batches)
    warmup, steps, block = plan
    runner.run(warmup)
    before = minor_faults()
    for _ in range(max(1, steps // block)):
        runner.timed_block(block)
    after = minor_faults()
    faults = None if before is None else (after - before) / max(1, len(runner.seconds) * block)
    return runner.seconds, read(runner.loss), {"threads": _threads_of(name), "faults": faults}


def _threads_of(name: str) -> int | None:
    """The threads CPU row `name` ran on: smallem's team, PyTorch's intra-op pool, or BLAS's."""
    if name.startswith("smallem"):
        from ..backends.cpu import team_size

        return team_size()
    if name.startswith("PyTorch"):
        import torch

        return torch.get_num_threads()
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    return max((lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"),
               default=None)

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
              plan: tuple[int, int, int], seed: int = 0, log: Callable[[str], Any] | None = None
              ) -> dict[str, tuple[list[float], Any, dict]]:
    """Seconds per step of every timed block, the last loss, and {"threads", "faults"} (the
    last round's: threads it ran on, minor page faults per step) of each CPU row in `names`:
    each row in a fresh process per round, `plan` = (warmup, steps, block) split over the rounds.
    `time_row(model, name, batches, plan, seed)` times one row there (time_row below: a
    module-level function, so the child imports it by name). `log` hears each row's round as it
    ends (a run cut short keeps what it measured)."""
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
                if log is not None:
                    log(f"  {name}: {1e3 * sorted(seconds)[len(seconds) // 2]:.1f} ms/step in this "
                        f"round{cpu_words(_Seen(info))}")
    return out


def threads_of(name: str) -> int | None:
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


def measured(runner: Any, timed: Callable[[], None], name: str) -> dict[str, Any]:
    """Run `timed()` (the row's timed blocks) and say what it ran on: {"threads": threads_of(name),
    "faults": minor page faults per step it took (fresh pages the kernel zeroed)}."""
    from ..backends.cpu import minor_faults

    before, steps = minor_faults(), runner.k
    timed()
    after, steps = minor_faults(), runner.k - steps
    faults = None if before is None or after is None else (after - before) / max(1, steps)
    return {"threads": threads_of(name), "faults": faults}


class _Seen:  # what cpu_words reads of a row, for a round's line
    device = "cpu"

    def __init__(self, info: dict) -> None:
        self.threads, self.faults = info.get("threads"), info.get("faults")


def cpu_words(row: Any) -> str:
    """A CPU row's threads and page faults per step, as bench's log says them."""
    if row.device != "cpu":
        return ""
    faults = "-" if row.faults is None else f"{row.faults:,.0f}"
    return f", {row.threads or '-'} threads, {faults} page faults/step"

"""The learner's ring all-reduce on real MPI ranks: `run_on_ranks` starts N processes through the
package's ranks (`smallem.ranks.run`: MPICH's `mpiexec` from the `mpich` wheel), each plays one
device of the same `ring_allreduce(grads, send)` (its own entry of `grads` is real; `send` moves
bytes over MPI when the rank is one end of a message) and compares its sum with MPI's Allreduce."""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import SmallemError
from ...ranks import mpiexec, run

HERE = f"{__name__}:rank_ring"  # what each rank runs, found by name in a fresh interpreter


@dataclass(frozen=True)
class RanksResult:
    """What the ranks measured: per rank, the bytes it sent through the ring, the largest
    difference between its ring sum and MPI's Allreduce, and the seconds each took."""
    ranks: int
    length: int  # numbers in each rank's gradient (float64)
    sent: list[int]
    difference: list[float]
    ring_seconds: list[float]
    allreduce_seconds: list[float]
    source: str  # "your ring_allreduce", or the package's reference where yours had no source


def mpi_available() -> bool:
    try:
        mpiexec()
    except SmallemError:
        return False
    return True


def _source(ring: Callable) -> tuple[str, str, str]:
    """(source, name, whose): the function's own cell, or the package's reference solution."""
    try:
        return inspect.getsource(ring), ring.__name__, "your ring_allreduce"
    except (OSError, TypeError):  # defined by exec (the reference `use` hands on): no file to read
        from ..common.grading import EXERCISES
        return EXERCISES["17.ring_allreduce"].solution_cell, "ring_allreduce", "the package's reference ring"


def run_on_ranks(ring: Callable, ranks: int = 2, length: int = 1_000_000, seed: int = 0,
                 timeout: float = 120.0) -> RanksResult:
    """Run `ring` (a ring_allreduce(grads, send)) on `ranks` MPI processes, each holding a random
    gradient of `length` float64 numbers, and compare each rank's sum with MPI's Allreduce."""
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise SmallemError(f"ranks must be a whole number of at least 1, got {ranks!r}")
    source, name, whose = _source(ring)
    try:
        rows = run(ranks, HERE, source, name, int(length), int(seed), timeout=timeout)
    except SmallemError:
        raise
    except Exception as error:  # noqa: BLE001  (the learner's ring raised on a rank: one sentence)
        raise SmallemError(f"{whose} raised {type(error).__name__} ({error}) on the MPI ranks") from None
    sent, difference, ring_seconds, allreduce_seconds = (list(column) for column in zip(*rows))
    return RanksResult(ranks, int(length), sent, difference, ring_seconds, allreduce_seconds, whose)


def rank_ring(world: Any, source: str, name: str, length: int, seed: int) -> tuple[int, float, float, float]:
    """One rank: play device `world.rank` of the learner's ring, then MPI's Allreduce on the same
    gradient. Returns (bytes sent, largest difference, ring seconds, Allreduce seconds)."""
    from mpi4py import MPI

    comm, rank = world.comm, world.rank
    namespace: dict = {"np": np, "math": math}
    exec(compile(source, "<ring_allreduce>", "exec"), namespace)  # noqa: S102  (the learner's cell)
    ring = namespace[name]
    mine = np.random.default_rng(seed + rank).normal(size=length)
    grads = [np.zeros_like(mine) for _ in range(world.size)]  # the other devices live in other processes
    grads[rank] = mine.copy()
    sent = 0

    def send(src: int, dst: int, chunk: np.ndarray) -> np.ndarray:
        nonlocal sent
        chunk = np.ascontiguousarray(chunk, dtype=np.float64)
        if src == rank:
            comm.Send(chunk, dest=dst)
            sent += chunk.nbytes
            return chunk.copy()
        if dst == rank:
            arrived = np.empty_like(chunk)
            comm.Recv(arrived, source=src)
            return arrived
        return chunk.copy()  # a message between two other ranks: this process plays neither end

    world.barrier()
    start = time.perf_counter()
    summed = np.asarray(ring(grads, send)[rank], dtype=np.float64)
    ring_seconds = time.perf_counter() - start
    reference = mine.copy()
    world.barrier()
    start = time.perf_counter()
    comm.Allreduce(MPI.IN_PLACE, reference, op=MPI.SUM)
    allreduce_seconds = time.perf_counter() - start
    return sent, float(np.max(np.abs(summed - reference))), ring_seconds, allreduce_seconds

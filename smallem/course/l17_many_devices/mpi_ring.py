"""The learner's ring all-reduce on real MPI ranks: `run_on_ranks` starts N processes with MPICH's
`mpiexec` (from the `mpich` wheel, `pip install "smallem[ranks]"`), each runs this module, plays
one device of the same `ring_allreduce(grads, send)` (its own entry of `grads` is real, `send`
moves bytes over MPI when it is one end of a message) and compares its sum with MPI's Allreduce."""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import SmallemError

INSTALL = 'pip install "smallem[ranks]"'  # mpi4py and MPICH's wheel: no system MPI needed


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


def mpiexec() -> str | None:
    """MPICH's launcher: beside this Python (a venv's bin/, where the mpich wheel puts it), or on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.is_file() else shutil.which("mpiexec")


def mpi_available() -> bool:
    return importlib.util.find_spec("mpi4py") is not None and mpiexec() is not None


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
    if not mpi_available():
        raise SmallemError(f"MPI is not installed for this Python: run `{INSTALL}` (mpi4py and MPICH's "
                           "wheel, no system MPI needed), then restart the kernel")
    if not isinstance(ranks, int) or ranks < 1:
        raise SmallemError(f"ranks must be a whole number of at least 1, got {ranks!r}")
    source, name, whose = _source(ring)
    with tempfile.TemporaryDirectory(prefix="smallem-ranks-") as folder:
        job = {"source": source, "name": name, "length": int(length), "seed": int(seed)}
        (Path(folder) / "job.json").write_text(json.dumps(job), encoding="utf-8")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}  # one core a rank
        command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", __name__, folder]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise SmallemError(f"the {ranks} MPI ranks did not finish within {timeout:.0f} s: a ring whose "
                               "ranks call send in different orders waits forever") from None
        result = Path(folder) / "result.json"
        if done.returncode != 0 or not result.is_file():
            lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
            raise SmallemError(f"the {ranks} MPI ranks stopped (exit code {done.returncode}): "
                               f"{lines[-1] if lines else 'no message'}")
        data = json.loads(result.read_text(encoding="utf-8"))
    return RanksResult(ranks=ranks, length=int(length), source=whose, **data)


def _rank_main(folder: Path) -> None:
    """One rank: play device `rank` of the learner's ring, then MPI's Allreduce on the same gradient."""
    from mpi4py import MPI

    from ...files import write_json

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    job = json.loads((folder / "job.json").read_text(encoding="utf-8"))
    namespace: dict = {"np": np, "math": math}
    exec(compile(job["source"], "<ring_allreduce>", "exec"), namespace)  # noqa: S102  (the learner's cell)
    ring = namespace[job["name"]]
    mine = np.random.default_rng(job["seed"] + rank).normal(size=job["length"])
    grads = [np.zeros_like(mine) for _ in range(size)]  # the other devices live in other processes
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

    comm.Barrier()
    start = time.perf_counter()
    summed = np.asarray(ring(grads, send)[rank], dtype=np.float64)
    ring_seconds = time.perf_counter() - start
    reference = np.empty_like(mine)
    comm.Barrier()
    start = time.perf_counter()
    comm.Allreduce(mine, reference, op=MPI.SUM)
    allreduce_seconds = time.perf_counter() - start
    row = (sent, float(np.max(np.abs(summed - reference))), ring_seconds, allreduce_seconds)
    rows = comm.gather(row, root=0)
    if rank == 0:
        columns = zip(*rows)
        write_json(folder / "result.json", dict(zip(("sent", "difference", "ring_seconds",
                                                     "allreduce_seconds"), map(list, columns))))


if __name__ == "__main__":
    _rank_main(Path(sys.argv[1]))

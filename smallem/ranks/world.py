"""Who the ranks are: a `World` is this process's place among the processes of one data-parallel
run (its rank, their number) and the collectives they share. `Solo` is one process alone (no MPI
imported); `MpiWorld` wraps mpi4py's COMM_WORLD under `mpiexec` (MPICH from its PyPI wheel). The
rows a rank reads (`rows`) and the bytes a ring moves (`ring_bytes`) are here too.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import numpy as np

from ..errors import SmallemError

INSTALL = "pip install 'smallem[ranks]' (mpi4py and MPICH's wheel: no system MPI needed)"
# Variables a process started by an MPI launcher finds in its environment (MPICH's hydra, Open
# MPI, Slurm's PMI): their presence means "use MPI", even for one rank.
LAUNCHED = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


class World(Protocol):
    """This process's place in a run: `rank` of `size`; `allreduce` sums a NumPy array over
    the ranks in place; `iallreduce` starts that sum and returns a request whose `Wait()` ends it;
    `bcast` gives rank 0's object to all; `abort` stops every rank at once."""

    rank: int
    size: int
    comm: Any

    def allreduce(self, array: np.ndarray) -> np.ndarray: ...
    def iallreduce(self, array: np.ndarray) -> Any: ...
    def bcast(self, obj: Any) -> Any: ...
    def allgather(self, obj: Any) -> list[Any]: ...
    def barrier(self) -> None: ...
    def abort(self, code: int = 1) -> None: ...


class _Done:
    """A request that is already complete (Solo's all-reduce of one rank)."""

    def Wait(self) -> None:  # noqa: N802 - mpi4py's names, so either request will do
        return None

    def Test(self) -> bool:  # noqa: N802
        return True


class Solo:
    """One process alone: every collective is the identity. What `train` uses without MPI."""

    rank, size, comm = 0, 1, None

    def allreduce(self, array: np.ndarray) -> np.ndarray:
        return array

    def iallreduce(self, array: np.ndarray) -> _Done:
        return _Done()

    def bcast(self, obj: Any) -> Any:
        return obj

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        pass

    def abort(self, code: int = 1) -> None:
        raise SystemExit(code)


class MpiWorld:
    """The processes `mpiexec` started, through mpi4py's COMM_WORLD (or `comm`, a part of them).
    Arrays are summed in place (MPI.IN_PLACE): the gradient buffer is the message, no copy."""

    def __init__(self, comm: Any = None) -> None:
        MPI = mpi()
        self.MPI, self.comm = MPI, MPI.COMM_WORLD if comm is None else comm
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def allreduce(self, array: np.ndarray) -> np.ndarray:
        self.comm.Allreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM)
        return array

    def iallreduce(self, array: np.ndarray) -> Any:
        return self.comm.Iallreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM)

    def bcast(self, obj: Any) -> Any:
        return self.comm.bcast(obj, root=0)

    def allgather(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)


def mpi() -> Any:
    """mpi4py's MPI module, or one sentence saying how to install it."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise SmallemError(f"ranks run through MPI, and mpi4py is not installed: {INSTALL}"
                           ) from None
    return MPI


def launched() -> bool:
    """Whether an MPI launcher (mpiexec, srun) started this process."""
    return any(name in os.environ for name in LAUNCHED)


_WORLD: World | None = None


def world() -> World:
    """This process's World: an MpiWorld when an MPI launcher started it, else Solo (one rank;
    mpi4py not even imported). The same object on every call."""
    global _WORLD
    if _WORLD is None:
        _WORLD = MpiWorld() if launched() else Solo()
    return _WORLD


def rows(batch: int, size: int, rank: int) -> tuple[int, int]:
    """The rows [start, stop) of a batch of `batch` that rank `rank` of `size` reads: as even as
    can be, the first `batch % size` ranks one row more (10 rows on 3 ranks: 4, 3, 3)."""
    if size > batch:
        raise SmallemError(f"{size} ranks cannot share a batch of {batch}: each needs a row at "
                           f"least; raise --batch to {size} or more, or use fewer ranks")
    share, extra = divmod(batch, size)
    start = rank * share + min(rank, extra)
    return start, start + share + (rank < extra)


def ring_bytes(nbytes: int, n: int) -> float:
    """Bytes each rank sends in a ring all-reduce of `nbytes` over `n` ranks: a reduce-scatter
    then an all-gather, n−1 chunks of nbytes/n each: 2(n−1)/n · nbytes, whatever n."""
    return 2 * (n - 1) / n * nbytes


def gather_bytes(nbytes: int, n: int) -> float:
    """Bytes the busiest rank (the root) sends when every rank sends its gradients to rank 0,
    which sends the sum back to each: (n−1) · nbytes, growing with n."""
    return (n - 1) * nbytes

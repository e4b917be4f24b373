"""Ranks on GPUs: one process per GPU, gradients summed by NCCL (`cupy.cuda.nccl`, which CuPy's
wheels bring) on device buffers, on a side stream joined back by events, so that a captured step
records the all-reduce in its graph. MPI (or one rank alone) only starts the ranks and passes
NCCL's unique id; every other collective stays on the host World underneath.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import SmallemError
from .world import World


def use_device(world: World) -> int:
    """Rank r uses GPU r (one process per GPU, on one host); its index."""
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if world.size > count:  # NCCL refuses two ranks on one GPU ("duplicate GPU")
        raise SmallemError(f"{world.size} GPU ranks need {world.size} GPUs and this host shows "
                           f"{count}: ask for --ranks {count} or fewer, or train the ranks on "
                           "the CPU (--backend cpu)")
    device = world.rank % count
    cupy.cuda.Device(device).use()
    return device


class _Joined:
    """An all-reduce queued on the side stream: `Wait()` makes the compute stream wait for it
    (an event, no host sync: inside a capture this is the graph's join)."""

    def __init__(self, stream: Any, done: Any) -> None:
        self.stream, self.done = stream, done

    def Wait(self) -> None:  # noqa: N802 - the name of mpi4py's requests
        self.stream.wait_event(self.done)

    def Test(self) -> bool:  # noqa: N802
        return False


class NcclWorld:
    """The host `world`'s ranks with an NCCL communicator over their GPUs: `iallreduce` and
    `allreduce` of a CuPy array go through NCCL, of a NumPy array through the host world."""

    def __init__(self, world: World) -> None:
        import cupy
        from cupy.cuda import nccl

        self.cupy, self.nccl, self.host = cupy, nccl, world
        self.rank, self.size = world.rank, world.size
        unique = world.bcast(nccl.get_unique_id() if world.rank == 0 else None)
        self.comm = nccl.NcclCommunicator(world.size, unique, world.rank)
        self.side = cupy.cuda.Stream(non_blocking=True)
        self.types = {np.dtype(np.float32): nccl.NCCL_FLOAT32,
                      np.dtype(np.float64): nccl.NCCL_FLOAT64}

    def _code(self, array: Any) -> int:
        if array.dtype not in self.types:
            raise SmallemError(f"NCCL sums float32 or float64 gradients here, not {array.dtype}")
        return self.types[array.dtype]

    def iallreduce(self, array: Any) -> Any:
        if isinstance(array, np.ndarray):
            return self.host.iallreduce(array)
        cuda = self.cupy.cuda
        current = cuda.get_current_stream()
        ready = cuda.Event(disable_timing=True)
        ready.record(current)
        self.side.wait_event(ready)  # the gradients are written: sum them beside the compute
        self.comm.allReduce(array.data.ptr, array.data.ptr, array.size, self._code(array),
                            self.nccl.NCCL_SUM, self.side.ptr)
        done = cuda.Event(disable_timing=True)
        done.record(self.side)
        return _Joined(current, done)

    def allreduce(self, array: Any) -> Any:
        if isinstance(array, np.ndarray):
            return self.host.allreduce(array)
        self.iallreduce(array).Wait()
        return array

    def bcast(self, obj: Any) -> Any:
        return self.host.bcast(obj)

    def allgather(self, obj: Any) -> list[Any]:
        return self.host.allgather(obj)

    def barrier(self) -> None:
        self.host.barrier()

    def abort(self, code: int = 1) -> None:
        self.host.abort(code)

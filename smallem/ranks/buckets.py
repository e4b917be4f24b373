"""The gradient buffer a data-parallel step sums across ranks: every parameter's gradient in one
flat array, in the order backward finishes them, cut into buckets of about `bucket_bytes` (as
PyTorch's DDP does). With `overlap`, a bucket's all-reduce starts (MPI Iallreduce; NCCL on a side
stream) as soon as its last gradient is final, while backward computes the blocks below;
without, all of them once backward is done.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from .world import World

BUCKET_BYTES = 1 << 20  # 1 MiB: several buckets for the course's models (the MLP's are 1.6 MB)


class Buckets:
    """`order`: (key, shape) of each gradient, in the order backward makes them final (the
    last-bound parameter first); `extras` floats ride at the end of the last bucket (the
    step's loss sum, its stop flag), so they cost no message of their own. `xp`: NumPy for a
    host buffer (MPI), CuPy for a device one (NCCL, ranks/nccl.py)."""

    def __init__(self, world: World, order: Sequence[tuple[Hashable, tuple[int, ...]]],
                 dtype: Any, *, extras: int = 0, bucket_bytes: int = BUCKET_BYTES,
                 overlap: bool = True, xp: Any = np) -> None:
        self.world, self.overlap, self.extras = world, overlap, extras
        self.spans: dict[Hashable, tuple[int, int, tuple[int, ...]]] = {}
        self.bucket_of: dict[Hashable, int] = {}
        bounds, start, itemsize = [0], 0, np.dtype(dtype).itemsize
        for key, shape in order:
            size = int(np.prod(shape, dtype=np.int64))
            self.spans[key] = (start, start + size, tuple(shape))
            self.bucket_of[key] = len(bounds) - 1
            start += size
            if (start - bounds[-1]) * itemsize >= bucket_bytes:
                bounds.append(start)  # this bucket is full: the next key opens another
        if bounds[-1] != start or len(bounds) == 1:
            bounds.append(start)
        bounds[-1] = start + extras  # the extras close the last bucket
        self.bounds = bounds
        self.sizes = [sum(1 for k in self.bucket_of.values() if k == b)
                      for b in range(len(bounds) - 1)]
        self.xp = xp  # NumPy (MPI's host buffers) or CuPy (NCCL's device buffers)
        self.flat = xp.zeros(bounds[-1], dtype=dtype)
        self.reset()

    def reset(self) -> None:
        """Before a step: nothing summed, nothing sent."""
        self.flat[:] = 0
        self.waiting = list(self.sizes)  # gradients each bucket still waits for
        self.requests: dict[int, Any] = {}
        self.started_at: float | None = None
        self.wait_seconds = 0.0

    def add(self, key: Hashable, grad: np.ndarray, final: bool) -> None:
        """Add one gradient into its place; `final`: no more will come for it this step (the
        last micro-batch), and a bucket complete now starts its all-reduce (with overlap)."""
        start, stop, _ = self.spans[key]
        view = self.flat[start:stop]
        view += grad.reshape(-1)
        if not final:
            return
        bucket = self.bucket_of[key]
        self.waiting[bucket] -= 1
        if self.overlap and self.waiting[bucket] == 0 and bucket != len(self.sizes) - 1:
            self._start(bucket)
        elif self.requests:  # MPI moves a message only inside an MPI call: let it progress
            for request in self.requests.values():
                request.Test()

    def _start(self, bucket: int) -> None:
        if self.started_at is None:
            self.started_at = time.perf_counter()
        self.requests[bucket] = self.world.iallreduce(self.flat[self.bounds[bucket]:
                                                                self.bounds[bucket + 1]])

    def finish(self, extras: Sequence[float] = ()) -> np.ndarray:
        """Write the extras, send what is not sent yet, wait for every sum: the whole buffer,
        summed over the ranks. `wait_seconds` is the time spent waiting here."""
        if len(extras):  # (a device step writes its own, without reading them on the host)
            self.flat[-self.extras:] = extras
        began = time.perf_counter()
        for bucket in range(len(self.sizes)):
            if bucket not in self.requests:
                self._start(bucket)
        for request in self.requests.values():
            request.Wait()
        self.wait_seconds = time.perf_counter() - began
        return self.flat

    def gradient(self, key: Hashable) -> np.ndarray:
        """The summed gradient of `key`: a view of the buffer, in its shape."""
        start, stop, shape = self.spans[key]
        return self.flat[start:stop].reshape(shape)

    def tail(self) -> np.ndarray:
        """The summed extras."""
        return self.flat[len(self.flat) - self.extras:]

"""Lesson 17's simulated devices: N gradients as a list of arrays, and a `Wire` that carries
every message from one device to another and counts the bytes each device sends. The ring
all-reduce (reduce-scatter, then all-gather) and the naive gather-to-one are written against it;
mpi_ring.py gives the same `send` over real MPI ranks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ...errors import SmallemError


@dataclass
class Wire:
    """The links between N simulated devices: `send(src, dst, chunk)` returns what `dst`
    receives (a copy: devices share no memory) and counts `chunk`'s bytes against `src`."""
    devices: int
    sent: list[int] = field(default_factory=list)  # bytes each device sent
    log: list[tuple[int, int, int]] = field(default_factory=list)  # (src, dst, elements) per message

    def __post_init__(self) -> None:
        self.sent = [0] * self.devices

    def send(self, src: int, dst: int, chunk: np.ndarray) -> np.ndarray:
        for name, rank in (("src", src), ("dst", dst)):
            if not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.devices:
                raise SmallemError(f"send's {name} must be a device number from 0 to {self.devices - 1}, "
                                   f"got {rank!r}")
        if src == dst:
            raise SmallemError(f"device {src} sends to itself: a message goes to another device")
        chunk = np.array(chunk, copy=True)
        self.sent[int(src)] += chunk.nbytes
        self.log.append((int(src), int(dst), chunk.size))
        return chunk


def chunk_bounds(length: int, devices: int) -> list[tuple[int, int]]:
    """Where np.array_split(x, devices) cuts x of `length`: the first length % devices chunks
    hold one element more."""
    sizes = [length // devices + (k < length % devices) for k in range(devices)]
    ends = np.cumsum(sizes).tolist()
    return [(end - size, end) for size, end in zip(sizes, ends)]


def ring_reference(grads: Sequence[np.ndarray], send) -> list[np.ndarray]:
    """The package's ring all-reduce over simulated devices (the lesson's solution, in other words):
    reduce-scatter, then all-gather, each N − 1 steps of one chunk per device to the next."""
    n = len(grads)
    parts = [np.array_split(np.array(g, dtype=np.float64), n) for g in grads]
    for s in range(n - 1):  # reduce-scatter: device r passes on chunk (r − s) mod N, summed so far
        arrived = [(r, (r - s) % n, send(r, (r + 1) % n, parts[r][(r - s) % n])) for r in range(n)]
        for r, c, chunk in arrived:
            parts[(r + 1) % n][c] = parts[(r + 1) % n][c] + chunk
    for s in range(n - 1):  # all-gather: device r passes on chunk (r + 1 − s) mod N, finished
        arrived = [(r, (r + 1 - s) % n, send(r, (r + 1) % n, parts[r][(r + 1 - s) % n])) for r in range(n)]
        for r, c, chunk in arrived:
            parts[(r + 1) % n][c] = chunk
    return [np.concatenate(p) for p in parts]


def naive_allreduce(grads: Sequence[np.ndarray], send) -> list[np.ndarray]:
    """Gather to one: every device sends its whole gradient to device 0, which sums and sends the
    sum back to each. Device 0 sends (N − 1) full gradients and receives as many."""
    n = len(grads)
    total = np.array(grads[0], dtype=np.float64)
    for r in range(1, n):
        total = total + send(r, 0, grads[r])
    return [total] + [send(0, r, total) for r in range(1, n)]


def ring_bytes(length: int, devices: int, itemsize: int = 8) -> list[int]:
    """Bytes each device sends in `ring_reference`: every chunk but one in each half."""
    sizes = [end - start for start, end in chunk_bounds(length, devices)]
    if devices == 1:
        return [0]
    return [itemsize * (2 * length - sizes[(r + 1) % devices] - sizes[(r + 2) % devices])
            for r in range(devices)]

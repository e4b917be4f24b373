"""The CPU's thread team: the calling thread and size() − 1 helpers, each running NumPy calls on
its own share of an array. NumPy's loops and OpenBLAS release the GIL while they compute, so
shares of tens of microseconds or more run side by side; helpers sleep between calls (no spinning
that would take a busy machine's cores). Work is cut into pieces that depend on its shape alone,
never on the team's size: one thread or sixteen, every piece is the same call and every sum adds
the same pieces in the same order, so the numbers are the same bits whatever the machine's load."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_size = 1
_pool: ThreadPoolExecutor | None = None


def size() -> int:
    return _size


def resize(n: int) -> None:
    """n threads from now on (the caller included); the old helpers finish and go."""
    global _size, _pool
    n = max(1, int(n))
    if n == _size:
        return
    old, _pool, _size = _pool, (ThreadPoolExecutor(n - 1, "smallem-cpu") if n > 1 else None), n
    if old is not None:
        old.shutdown(wait=False)


def run(fn: Callable[[Any], Any], parts: Sequence[Any]) -> list[Any]:
    """[fn(p) for p in parts], the parts shared over the team (the caller runs the first):
    results in the parts' order, whatever order they finish in."""
    pool = _pool
    if pool is None or len(parts) < 2:
        return [fn(p) for p in parts]
    futures = [pool.submit(fn, p) for p in parts[1:]]
    first = fn(parts[0])
    return [first] + [f.result() for f in futures]


MAX_PIECES = 16  # pieces of one piece of work: enough for 16 cores, few calls on one


def pieces(total: int, weight: int, least: int, multiple: int = 1) -> list[slice]:
    """`total` items (each `weight` units of work) cut into consecutive slices of at least
    `least` units and at most MAX_PIECES slices, cuts on multiples of `multiple`: a function of
    the shape alone."""
    return spans(total, min(MAX_PIECES, (total * weight) // max(1, least)), multiple)


def run_pieces(fn: Callable[[slice], Any], cut: Sequence[slice]) -> list[Any]:
    """[fn(s) for s in cut], each thread running a consecutive run of the pieces in order."""
    if len(cut) < 2 or _pool is None:
        return [fn(s) for s in cut]
    return [r for run_ in run(lambda g: [fn(s) for s in cut[g]], spans(len(cut), _size))
            for r in run_]


def spans(total: int, parts: int, multiple: int = 1) -> list[slice]:
    """`total` items cut into at most `parts` consecutive slices of near-equal length, every
    cut on a multiple of `multiple` (the last slice takes the remainder); none empty."""
    units = -(-total // multiple)
    parts = max(1, min(parts, units))
    cuts = [min(total, (units * k // parts) * multiple) for k in range(parts + 1)]
    return [slice(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]

"""The CPU's thread team: the calling thread and size() − 1 helpers, each running NumPy calls on
pieces of an array. NumPy's loops and OpenBLAS release the GIL while they compute, so pieces of
tens of microseconds or more run side by side; helpers sleep between calls (no spinning that would
take a busy machine's cores), and take pieces from one shared counter, so a helper the machine
has descheduled holds up no one. Work is cut into pieces that depend on its shape alone, never on
the team's size: one thread or sixteen, every piece is the same call and every sum adds the same
pieces in the same order, so the numbers are the same bits whatever the machine's load.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

MAX_PIECES = 16  # pieces of one piece of work: enough for 16 cores, few calls on one
# Threads a run wakes: one per GRAIN units of its work, a unit being ~20 µs of one core (a least
# piece: 2^20 multiply-adds, or a pass over 2^16 floats), so that work is not handed to threads
# that each cost a wake-up and turns of the GIL (tens of µs on a many-core host) for little.
# Who computes a piece never changes its bits: only the pieces do, and they depend on the shape.
GRAIN = float(os.environ.get("SMALLEM_GRAIN", "1") or 1)

_size = 1
_inboxes: list[queue.SimpleQueue] = []  # one per helper: a job, or None to stop
_done: queue.SimpleQueue = queue.SimpleQueue()  # a helper's "finished" (or its exception)


def size() -> int:
    return _size


def _helper(inbox: queue.SimpleQueue, done: queue.SimpleQueue) -> None:
    while (job := inbox.get()) is not None:
        try:
            _work(*job)
            done.put(None)
        except BaseException as error:  # noqa: BLE001 - handed to the caller, raised there
            done.put(error)


def _work(fn: Callable[[Any], Any], parts: Sequence[Any], results: list, order: Any) -> None:
    for i in order:  # one iterator shared by the team: each index taken once
        results[i] = fn(parts[i])


def resize(n: int) -> None:
    """n threads from now on (the caller included); the old helpers finish and go."""
    global _size, _inboxes, _done
    n = max(1, int(n))
    if n == _size:
        return
    for inbox in _inboxes:
        inbox.put(None)
    _inboxes, _done = [queue.SimpleQueue() for _ in range(n - 1)], queue.SimpleQueue()
    for inbox in _inboxes:
        threading.Thread(target=_helper, args=(inbox, _done), name="smallem-cpu", daemon=True).start()
    _size = n


def worth(units: float) -> int:
    """Threads worth waking for `units` of work (~20 µs of one core each): one per GRAIN."""
    return max(1, int(units / GRAIN))


def run(fn: Callable[[Any], Any], parts: Sequence[Any], threads: int | None = None) -> list[Any]:
    """[fn(p) for p in parts], the parts shared over the team (the caller works too), at most
    `threads` threads (None: the whole team): results in the parts' order, whoever computed them."""
    helpers = min(len(_inboxes), len(parts) - 1, (threads or _size) - 1)
    if helpers < 1:
        return [fn(p) for p in parts]
    results: list[Any] = [None] * len(parts)
    order = iter(range(len(parts)))
    job = (fn, parts, results, order)
    inboxes, done = _inboxes, _done
    for inbox in inboxes[:helpers]:
        inbox.put(job)
    error = None
    try:
        _work(*job)
    except BaseException as e:  # noqa: BLE001 - the helpers are waited for first
        error = e
    for _ in range(helpers):
        error = done.get() or error
    if error is not None:
        raise error
    return results


def pieces(total: int, weight: int, least: int, multiple: int = 1) -> list[slice]:
    """`total` items (each `weight` units of work) cut into consecutive slices of at least
    `least` units and at most MAX_PIECES slices, cuts on multiples of `multiple`: a function of
    the shape alone."""
    return spans(total, min(MAX_PIECES, (total * weight) // max(1, least)), multiple)


def run_pieces(fn: Callable[[slice], Any], cut: Sequence[slice], threads: int | None = None
               ) -> list[Any]:
    """[fn(s) for s in cut], the pieces shared over (at most `threads` of) the team."""
    return run(fn, cut, threads)


def spans(total: int, parts: int, multiple: int = 1) -> list[slice]:
    """`total` items cut into at most `parts` consecutive slices of near-equal length, every
    cut on a multiple of `multiple` (the last slice takes the remainder); none empty."""
    units = -(-total // multiple)
    parts = max(1, min(parts, units))
    cuts = [min(total, (units * k // parts) * multiple) for k in range(parts + 1)]
    return [slice(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]

"""The CPU's thread team: the calling thread and size() − 1 helpers, each running NumPy calls on
pieces of an array. NumPy's loops and OpenBLAS release the GIL while they compute, so pieces of
tens of microseconds or more run side by side; helpers sleep between calls (on a team of 16 threads
or more, in compiled_team.py's loop: SMALLEM_SPIN µs spinning, ready for the next compiled Linear,
then asleep there without the GIL until a job wakes them; never a longer spin: a busy machine's
cores are not spun on), and take pieces from one shared counter, so a helper the machine has
descheduled, or wakes late, holds up no one. Work is cut into pieces that depend on its shape
alone, never on the team's size: one thread or sixteen, every piece is the same call and every
sum adds the same pieces in the same order, so the numbers are the same bits whatever the load.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import SmallemError

MAX_PIECES = 16  # pieces of one piece of work: enough for 16 cores, few calls on one
# Threads a run wakes: one per GRAIN units of its work, a unit being ~20 µs of one core (a least
# piece: 2^20 multiply-adds, or a pass over 2^16 floats), so that work is not handed to threads
# that each cost a wake-up and turns of the GIL (tens of µs on a many-core host) for little.
# Who computes a piece never changes its bits: only the pieces do, and they depend on the shape.
# 8: the fastest of 1-32 on the 16-core host in round 7 (benchmarks/results/round7/cpu_scaling.md),
# within noise of the fastest on 2 cores; SMALLEM_GRAIN overrides it (read once, at import).
GRAIN_ENV = "SMALLEM_GRAIN"


def positive_env(name: str, default: float, what: str) -> float:
    """The number in environment variable `name` (more than 0, at most 1e6), else `default`; a
    bad value is one sentence naming `what` it gives (round 14: a bare float() at import made it a
    ValueError's traceback). SMALLEM_GRAIN and linear.py's SMALLEM_POOL_GRAIN read through it."""
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = 0.0
    if not 0 < value <= 1e6:
        raise SmallemError(f"{name}={raw!r}: give {what}, more than 0 (or unset it for the default, "
                           f"{default:g})")
    return value


def _grain() -> float:
    """SMALLEM_GRAIN (units of work a thread is woken for), else 8."""
    return positive_env(GRAIN_ENV, 8.0, "the units of work (~20 µs each) worth one more thread")


GRAIN = _grain()
# µs a helper spins in compiled code after a job, ready for the next compiled Linear
# (compiled_team.py), before it sleeps on its queue again; 0: it sleeps at once
SPIN_ENV, SPIN_US = "SMALLEM_SPIN", 50.0

_size = 1
_threads: list[threading.Thread] = []  # the helpers, joined when the team is resized
_inboxes: list[queue.SimpleQueue] = []  # one per helper: (a job, its RECALLED at the put), or None
_pool: Any = None  # compiled_team.Pool once a compiled Linear has run: helpers spin in it
JOIN_S = 10.0  # s resize waits for each old helper to go (round 11: one leaving late wrote over
# the new helper's line in the pool's state; round 16: one later still gets a pool of its own)
_pooling = threading.Lock()


def size() -> int:
    return _size


class _Job:
    """One run: its pieces, taken from one shared iterator (next() on it is atomic under the
    GIL), and a lock held until the last piece is done, by whoever does it. The caller waits for
    the pieces, not for the helpers: one the machine wakes late finds nothing left, and no one
    waits for it (on a many-core host a helper's wake-up costs tens of µs)."""

    __slots__ = ("fn", "parts", "results", "order", "finished", "done", "errors")

    def __init__(self, fn: Callable[[Any], Any], parts: Sequence[Any]) -> None:
        self.fn, self.parts, self.results = fn, parts, [None] * len(parts)
        self.order, self.finished = iter(range(len(parts))), itertools.count(1)
        self.done, self.errors = threading.Lock(), []
        self.done.acquire()

    def work(self) -> None:
        last = len(self.parts)
        for i in self.order:
            try:
                self.results[i] = self.fn(self.parts[i])
            except BaseException as error:  # noqa: BLE001 - raised by the caller, once all are done
                self.errors.append(error)
            if next(self.finished) == last:
                self.done.release()


class _Shared:
    """One run whose threads take their pieces themselves (a compiled loop on an atomic counter,
    compiled_linear.py): each thread calls `fn` once, which returns how many pieces it did; the
    one whose count brings the total to `total` releases the caller. The GIL is taken once a
    thread, not once a piece."""

    __slots__ = ("fn", "total", "finished", "count", "done", "errors")

    def __init__(self, fn: Callable[[], int], total: int) -> None:
        self.fn, self.total, self.finished = fn, total, 0
        self.count, self.done, self.errors = threading.Lock(), threading.Lock(), []
        self.done.acquire()

    def work(self) -> None:
        try:
            did = self.fn()
        except BaseException as error:  # noqa: BLE001 - raised by the caller; no one waits on it
            self.errors.append(error)
            did = self.total
        with self.count:
            if self.finished < self.total <= self.finished + did:
                self.done.release()
            self.finished += did


class _Serve:
    """A token: a helper asleep on its queue wakes and joins the compiled job published."""

    @staticmethod
    def work() -> None:
        pass


SERVE = _Serve()


def _helper(inbox: queue.SimpleQueue, me: int) -> None:
    while (item := inbox.get()) is not None:
        job, since = item
        job.work()
        # wait in the pool, joining compiled jobs, until a NumPy job is put; not once this
        # helper's team is gone (a resize that stopped waiting for it): its line in the pool's
        # state is a new helper's
        if _pool is not None and me < len(_inboxes) and _inboxes[me] is inbox:
            _pool.serve(me, since)


def _forget_helpers() -> None:
    """In a forked child: only the thread that forked is there, so the team starts again from
    one (the next settle() starts helpers of its own); a pool whose helpers were inside a job at
    the fork would wait for them forever."""
    global _size, _inboxes, _pool, _pooling, _threads
    _size, _inboxes, _pool, _pooling, _threads = 1, [], None, threading.Lock(), []


if hasattr(os, "register_at_fork"):  # not on Windows, which never forks
    os.register_at_fork(after_in_child=_forget_helpers)


def attach(pool: Any) -> None:
    """Helpers wait in `pool` between jobs from now on (compiled_team.Pool)."""
    global _pool
    _pool = pool


def _put(job: Any, helpers: int) -> None:
    """`job` in the first `helpers` queues, each helper recalled from the pool first (only
    those: the others keep waiting there, without the GIL), its item stamped with its recall."""
    if _pool is None:
        for inbox in _inboxes[:helpers]:
            inbox.put((job, 0))
        return
    _pool.recall(helpers)
    for i, inbox in enumerate(_inboxes[:helpers]):
        inbox.put((job, _pool.recalled(i)))


def resize(n: int) -> None:
    """n threads from now on (the caller included); the old helpers finish and go."""
    global _size, _inboxes, _threads, _pool
    n = max(1, int(n))
    if n == _size:
        return
    if _pool is not None:
        _pool.recall(len(_inboxes))
    for inbox in _inboxes:
        inbox.put(None)
    for old in _threads:  # gone before the new ones start: helper i's line in the pool's state is
        old.join(timeout=JOIN_S)  # the new helper i's, and an old one leaving late wrote over it
    _inboxes, _size = [], 1
    if any(old.is_alive() for old in _threads):  # one still busy (a machine too loaded to run it):
        _pool = None  # it leaves the old pool's arrays; the new team gets a pool of its own
    _threads = []
    inboxes = [queue.SimpleQueue() for _ in range(n - 1)]
    threads = []
    for started, inbox in enumerate(inboxes):
        try:
            helper = threading.Thread(target=_helper, args=(inbox, started), name="smallem-cpu", daemon=True)
            helper.start()
            threads.append(helper)
        except RuntimeError as error:  # the system's limit on threads: those started go again
            for begun in inboxes[:started]:
                begun.put(None)
            raise SmallemError(f"{n} threads asked for, but the system let only {started + 1} "
                               f"start ({error}): ask for fewer with --threads or SMALLEM_THREADS, "
                               "or leave both out to let smallem choose") from None
    _inboxes, _size, _threads = inboxes, n, threads


def spin_us() -> float:
    """SMALLEM_SPIN (µs, 0 or more), else SPIN_US; a bad value is one sentence."""
    raw = os.environ.get(SPIN_ENV, "").strip()
    if not raw:
        return SPIN_US
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1e6:
        raise SmallemError(f"{SPIN_ENV}={raw!r}: give the µs a helper waits for the next job, "
                           "0 or more (or unset it for the default)")
    return value


def worth(units: float, grain: float | None = None) -> int:
    """Threads worth waking for `units` of work (~20 µs of one core each): one per `grain`
    (GRAIN unless given)."""
    return max(1, int(units / (grain or GRAIN)))


def run(fn: Callable[[Any], Any], parts: Sequence[Any], threads: int | None = None) -> list[Any]:
    """[fn(p) for p in parts], the parts shared over the team (the caller works too), at most
    `threads` threads (None: the whole team): results in the parts' order, whoever computed them."""
    helpers = min(len(_inboxes), len(parts) - 1, (threads or _size) - 1)
    if helpers < 1:
        return [fn(p) for p in parts]
    job = _Job(fn, parts)
    _put(job, helpers)
    job.work()
    job.done.acquire()  # the last piece done, here or by a helper
    if job.errors:
        raise job.errors[0]
    return job.results


def share_helpers(total: int, threads: int | None = None) -> int:
    """How many helpers share() wakes for `total` pieces on at most `threads` threads (0 or
    less: the caller takes every piece, in order)."""
    return min(len(_inboxes), total - 1, (threads or _size) - 1)


def share(fn: Callable[[], int], total: int, threads: int | None = None) -> None:
    """fn() on the caller and up to `threads` − 1 helpers, each taking pieces of `total` from a
    counter of its own until none is left and returning how many it did; back when all are done."""
    helpers = share_helpers(total, threads)
    if helpers < 1:  # one thread: its loop takes every piece, no job, locks or queue (round 15)
        fn()
        return
    job = _Shared(fn, total)
    _put(job, helpers)
    job.work()
    job.done.acquire()
    if job.errors:
        raise job.errors[0]


def pooled(publish: Callable[[int], int], finish: Callable[[], None], total: int,
           threads: int | None = None) -> None:
    """A compiled job of `total` pieces on the pool (compiled_team.py): publish(helpers) writes
    it where the spinning helpers take it at once and returns a bit for each of the first
    `helpers` that sleeps, woken here through its queue; finish() does pieces on the caller and
    waits for the last. Back when every piece is done."""
    helpers = max(0, min(len(_inboxes), total - 1, (threads or _size) - 1, _pool.HELPERS))
    with _pooling:  # one job at a time in the pool's arrays, whichever thread calls
        # its arrays (in publish's closure) kept until the next job: an interrupt between
        # publish and finish leaves the helpers writing into arrays that must still be there
        _pool.keep = publish
        asleep = publish(helpers)
        for i in range(helpers):
            if asleep >> i & 1:
                _inboxes[i].put((SERVE, _pool.recalled(i)))
        finish()


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

"""Where the CPU team's helpers wait between the compiled Linears' runs (issue 38, beside
compiled_linear.py, used by linear.py on teams of linear.POOL_FROM threads): a numba loop that
spins a few µs (team.spin_us()) without the GIL and starts a Linear published meanwhile at once,
then (on Linux) sleeps in the kernel on a futex of its own, still inside the loop, without the GIL
(the atomics and the futex: compiled_sync.py).

Waking a sleeping helper makes it take the GIL to start its compiled call, one helper after
another: tens of µs apiece on a 16-core host; and a helper that left the loop for its queue after
every spin took the GIL each time, competing with the caller's Python (round 10: the tape, the
LayerNorms and AdamW slower on 16 threads than on 1). So a helper leaves the loop only when the
team's caller recalls it, helper by helper, for a NumPy job it put in that helper's queue; past its
spin it sleeps on its futex and the caller wakes only the sleepers a job is worth (a FUTEX_WAKE
each, no GIL). One job at a time, published by the team's caller: its pieces' table and its arrays'
addresses in shared int64 arrays, a sequence number (odd while the caller writes a job) telling the
spinners a new one is there. A piece is compiled_linear's piece on the same slice: team.share's
bits (tests/test_cpu_linear.py).
"""

from __future__ import annotations

import time

import numba
import numpy as np

from . import compiled_jobs
from .compiled_linear import EXACT, _forward_piece, _rule_piece
from .compiled_sync import SLEEPS, _add, _address, _floats, _load, _relax, _store, _wait, _wake

LINE = 8  # int64s per 64-byte cache line: each hot counter on a line of its own
SEQ, NEXT, DONE, INSIDE, TOTAL = (LINE * i for i in range(5))
# a helper's line in `state`: WHERE it is, its caller's recalls, its futex's WORD, the word it SLEPT on
WHERE, RECALLED, WORD, SLEPT = 0, 1, 2, 3
QUEUED, SPINNING, ASLEEP = 0, 1, 2  # WHERE: on its queue (team.py), in the loop, asleep in the loop
# args: the job's arrays' addresses, then its sizes
X, W, B, R, OUT, G, DX, DW, DWP, GRADS, DBP = range(11)
ROWS, K, N, GROWS, GCOLS, DWP_N, DBP_N, RESIDUAL = range(11, 19)
JOB = RESIDUAL + 1  # args from here: another job's values (compiled_jobs.py)
# table column 0: which piece function; then the piece's (kind, a, z, slot)
FORWARD, RULE, SUM, ATTENTION_FORWARD, ATTENTION_RULE = range(5)
# compiled_jobs' rows jobs, in its order
GELU, GELU_RULE, LAYER_NORM, LAYER_NORM_RULE, CROSS_ENTROPY, ADAMW, CROSS_ENTROPY_RULE = range(5, 12)
MAX_PIECES = 64


@numba.njit(**EXACT)
def _pieces(ctl, args, table):
    """Take the published job's pieces until none is left; each one done counts in DONE."""
    rows, k, n = args[ROWS], args[K], args[N]
    x = numba.carray(_floats(args[X]), (rows, k))
    w = numba.carray(_floats(args[W]), (k, n))
    while True:
        i = _add(ctl, NEXT, 1)
        if i >= _load(ctl, TOTAL):
            return
        if table[i, 0] == FORWARD:
            _forward_piece(x, w, numba.carray(_floats(args[B]), (n,)),
                           numba.carray(_floats(args[R]), (rows, n)), args[RESIDUAL] != 0,
                           numba.carray(_floats(args[OUT]), (rows, n)), table[i, 2], table[i, 3])
        elif table[i, 0] == SUM:  # rows a:z of dW = dw_parts[0] + dw_parts[1] + ..., in order
            parts = numba.carray(_floats(args[DWP]), (args[DWP_N], k, n))
            dw = numba.carray(_floats(args[DW]), (k, n))
            for row in range(table[i, 2], table[i, 3]):  # each element: part 0, then + 1, + 2, ...
                for j in range(n):
                    dw[row, j] = parts[0, row, j]
                for p in range(1, parts.shape[0]):
                    for j in range(n):  # along a row: SIMD, each element's adds still in order
                        dw[row, j] += parts[p, row, j]
        elif table[i, 0] >= GELU:  # rows a:z of GELU, LayerNorm, cross-entropy; AdamW's pieces a:z
            compiled_jobs.rows_piece(args[JOB:], table[i, 0] - GELU, table[i, 2], table[i, 3], table[i, 4])
        elif table[i, 0] >= ATTENTION_FORWARD:  # sequences a:z of the fused attention
            compiled_jobs.attention_piece(args[JOB:], table[i, 0] - ATTENTION_FORWARD, table[i, 2],
                                          table[i, 3])
        else:
            _rule_piece(numba.carray(_floats(args[G]), (rows, n)), x, w,
                        numba.carray(_floats(args[DX]), (rows, k)),
                        numba.carray(_floats(args[DW]), (k, n)),
                        numba.carray(_floats(args[DWP]), (args[DWP_N], k, n)),
                        numba.carray(_floats(args[GRADS]), (args[GROWS], args[GCOLS])),
                        numba.carray(_floats(args[DBP]), (args[DBP_N], args[GCOLS])),
                        table[i, 1], table[i, 2], table[i, 3], table[i, 4])
        _add(ctl, DONE, 1)


@numba.njit(**EXACT)
def serve(ctl, state, me, args, table, spins, since):
    """A helper's wait between runs: join each job published; with none, spin `spins` turns,
    then sleep on its futex (SLEEPS) or return to sleep on its queue; return at once when its
    RECALLED moves past `since` (a NumPy job waits in its queue). Its WHERE says which: the
    caller wakes an ASLEEP helper through its futex, a QUEUED one through its queue (a token).
    WHERE is written before SEQ and RECALLED are read again, and the caller writes those before
    it reads WHERE: a job or a recall meanwhile is seen by one of the two."""
    line = me * LINE
    _store(state, line + SLEPT, -1)
    _store(state, line + WHERE, SPINNING)
    seen, idle = -1, 0
    while True:
        s = _load(ctl, SEQ)
        if s != seen and s % 2 == 0:
            _add(ctl, INSIDE, 1)
            if _load(ctl, SEQ) == s:  # not rewritten since: its table is this job's
                _pieces(ctl, args, table)
            _add(ctl, INSIDE, -1)
            seen, idle = s, 0
        elif _load(state, line + RECALLED) != since:
            _store(state, line + WHERE, QUEUED)
            return
        elif idle >= spins:
            word = _load(state, line + WORD)
            _store(state, line + WHERE, ASLEEP if SLEEPS else QUEUED)
            s = _load(ctl, SEQ)
            if (s == seen or s % 2 == 1) and _load(state, line + RECALLED) == since:
                if not SLEEPS:  # none new (an odd one: its caller reads QUEUED after)
                    return
                _store(state, line + SLEPT, word)
                _wait(state, line + WORD, word)
            _store(state, line + WHERE, SPINNING)
            _store(state, line + SLEPT, -1)
            idle = 0
        else:
            idle += 1
            _relax()


@numba.njit(**EXACT)
def recall(state, helpers):
    """The first `helpers` helpers out of the loop, to their queues (a NumPy job is put there):
    each one's RECALLED moved on, and those asleep woken. Only the team's caller writes RECALLED."""
    for i in range(helpers):
        line = i * LINE
        _add(state, line + RECALLED, 1)
        if _load(state, line + WHERE) == ASLEEP:
            _wake(state, line + WORD)


@numba.njit(**EXACT)
def _open(ctl, state, helpers):
    """Start writing a job: SEQ odd (spinners keep off), then wait for those still inside the
    last one (they find no piece left) to leave."""
    _add(ctl, SEQ, 1)
    while _load(ctl, INSIDE) != 0:
        _relax()


@numba.njit(**EXACT)
def _close(ctl, state, helpers, total):
    """The job written: its counters reset, SEQ even; of the first `helpers` helpers, those asleep
    in the loop woken through their futexes, and a bit set for each one on its queue (the caller
    wakes those through their queues)."""
    _store(ctl, NEXT, 0)
    _store(ctl, DONE, 0)
    _store(ctl, TOTAL, total)
    _add(ctl, SEQ, 1)
    asleep = 0
    for i in range(helpers):
        where = _load(state, i * LINE + WHERE)
        if where == QUEUED:
            asleep |= 1 << i
        elif where == ASLEEP:
            _wake(state, i * LINE + WORD)
    return asleep


@numba.njit(**EXACT)
def publish_forward(ctl, state, helpers, args, table, x, w, b, r, residual, out, cuts):
    """Publish compiled_linear.linear_forward's pieces (rows cuts[i]:cuts[i + 1])."""
    _open(ctl, state, helpers)
    args[X], args[W], args[B], args[R], args[OUT] = (_address(x), _address(w), _address(b),
                                                     _address(r), _address(out))
    args[ROWS], args[K], args[N], args[RESIDUAL] = x.shape[0], w.shape[0], w.shape[1], residual
    for i in range(cuts.size - 1):
        table[i, 0], table[i, 1], table[i, 2], table[i, 3], table[i, 4] = FORWARD, 0, cuts[i], cuts[i + 1], 0
    return _close(ctl, state, helpers, cuts.size - 1)


@numba.njit(**EXACT)
def publish_rule(ctl, state, helpers, args, table, g, x, w, dx, dw, dw_parts, grads, db_parts, jobs):
    """Publish compiled_linear.linear_rule's pieces (jobs[i] = (kind, a, z, slot))."""
    _open(ctl, state, helpers)
    args[G], args[X], args[W], args[DX], args[DW] = (_address(g), _address(x), _address(w),
                                                     _address(dx), _address(dw))
    args[DWP], args[GRADS], args[DBP] = _address(dw_parts), _address(grads), _address(db_parts)
    args[ROWS], args[K], args[N] = x.shape[0], w.shape[0], w.shape[1]
    args[GROWS], args[GCOLS] = grads.shape[0], grads.shape[1]
    args[DWP_N], args[DBP_N] = dw_parts.shape[0], db_parts.shape[0]
    for i in range(jobs.shape[0]):
        table[i, 0] = RULE
        for j in range(4):
            table[i, j + 1] = jobs[i, j]
    return _close(ctl, state, helpers, jobs.shape[0])


@numba.njit(**EXACT)
def publish_sum(ctl, state, helpers, args, table, dw, dw_parts, cuts):
    """Publish dW = Σ dw_parts in order (linear.py's _sum_in_order: the same float32 adds), by
    rows cuts[i]:cuts[i + 1] of dW."""
    _open(ctl, state, helpers)
    args[DW], args[DWP], args[DWP_N] = _address(dw), _address(dw_parts), dw_parts.shape[0]
    args[X], args[W], args[ROWS], args[K], args[N] = 0, 0, 0, dw.shape[0], dw.shape[1]
    for i in range(cuts.size - 1):
        table[i, 0], table[i, 1], table[i, 2], table[i, 3], table[i, 4] = SUM, 0, cuts[i], cuts[i + 1], 0
    return _close(ctl, state, helpers, cuts.size - 1)


@numba.njit(**EXACT)
def publish_job(ctl, state, helpers, args, table, values, kind, cuts):
    """Publish a job of compiled_jobs.py: its `values` (what its pieces read) from args[JOB],
    its pieces cuts[i]:cuts[i + 1] of kind `kind`, piece i's slot i."""
    _open(ctl, state, helpers)
    for i in range(values.size):
        args[JOB + i] = values[i]
    for i in range(cuts.size - 1):
        table[i, 0], table[i, 1], table[i, 2], table[i, 3], table[i, 4] = kind, 0, cuts[i], cuts[i + 1], i
    return _close(ctl, state, helpers, cuts.size - 1)


@numba.njit(**EXACT)
def finish(ctl, args, table):
    """The caller's part: pieces until none is left, then the wait for the last one (a spin: a
    piece is tens of µs)."""
    _pieces(ctl, args, table)
    while _load(ctl, DONE) < _load(ctl, TOTAL):
        _relax()


@numba.njit(**EXACT)
def _spin(ctl, turns):
    total = 0
    for _ in range(turns):
        total += _load(ctl, SEQ)
        _relax()
    return total


class Pool:
    """The shared arrays of one team's compiled jobs, and its helpers' spin length in turns."""

    HELPERS = 63  # the wake-up mask's bits: helpers past it keep to their queues
    MAX_PIECES = MAX_PIECES  # a job's table: a larger one runs through team.share

    def __init__(self, spin_us: float) -> None:
        self.ctl = np.zeros(LINE * 6, np.int64)
        self.state = np.zeros(LINE * (self.HELPERS + 1), np.int64)
        self.args = np.zeros(JOB + compiled_jobs.SIZE, np.int64)
        self.table = np.zeros((MAX_PIECES, 5), np.int64)
        self.keep: object = None  # the last job's arrays (team.pooled)
        # compiled (or loaded from numba's cache) here, so that no helper holds numba's compiler lock
        # at a fork (the child would wait forever); a spare slot, RECALLED past `since`: it returns
        serve(self.ctl, self.state, self.HELPERS, self.args, self.table, 0, -1)
        recall(self.state, 0)
        _spin(self.ctl, 10)
        turns = 20_000
        start = time.perf_counter()
        _spin(self.ctl, turns)
        per_us = turns / max(1e-9, 1e6 * (time.perf_counter() - start))
        self.spins = self.default_spins = int(spin_us * per_us)

    def recall(self, helpers: int) -> None:
        """The first `helpers` helpers back to their queues (a NumPy job, or a resize, is
        there). Only the team's caller calls it."""
        recall(self.state, min(helpers, self.HELPERS))

    def recalled(self, me: int) -> int:
        """Helper `me`'s RECALLED now: the stamp a job put in its queue carries."""
        return int(self.state[me * LINE + RECALLED]) if me < self.HELPERS else 0

    def where(self, me: int) -> int:
        """QUEUED, SPINNING or ASLEEP: where helper `me` waits now."""
        return int(self.state[me * LINE + WHERE])

    def asleep(self, me: int) -> bool:
        """Helper `me` sleeps on its futex, no wake-up sent since (a woken helper reads ASLEEP
        until it runs: seconds on a loaded machine). Always False without a futex (not SLEEPS)."""
        line = me * LINE
        slept = int(self.state[line + SLEPT])  # read first: a waking helper clears it after WHERE
        return slept >= 0 and self.where(me) == ASLEEP and slept == int(self.state[line + WORD])

    def serve(self, me: int, since: int) -> None:
        if me < self.HELPERS:
            serve(self.ctl, self.state, me, self.args, self.table, self.spins, since)

    def publish_forward(self, helpers: int, x, w, b, r, residual: bool, out, cuts) -> int:
        return publish_forward(self.ctl, self.state, helpers, self.args, self.table, x, w, b, r,
                               residual, out, cuts)

    def publish_rule(self, helpers: int, g, x, w, dx, dw, dw_parts, grads, db_parts, jobs) -> int:
        return publish_rule(self.ctl, self.state, helpers, self.args, self.table, g, x, w, dx, dw,
                            dw_parts, grads, db_parts, jobs)

    def publish_sum(self, helpers: int, dw, dw_parts, cuts) -> int:
        return publish_sum(self.ctl, self.state, helpers, self.args, self.table, dw, dw_parts, cuts)

    def publish_job(self, helpers: int, values, kind: int, cuts) -> int:
        return publish_job(self.ctl, self.state, helpers, self.args, self.table, values, kind, cuts)

    def finish(self) -> None:
        finish(self.ctl, self.args, self.table)

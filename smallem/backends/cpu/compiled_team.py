"""Where the CPU team's helpers wait between the compiled Linears' runs (issue 38, beside
compiled_linear.py, used by linear.py on teams of linear.POOL_FROM threads): a numba loop that
spins a few µs (team.spin_us()) without the GIL and starts a Linear published meanwhile at once.

Waking a sleeping helper makes it take the GIL to start its compiled call, one helper after
another: tens of µs apiece on a 16-core host. Past the window a helper sleeps on its queue again
(team.py): a busy machine's cores are not spun on. One job at a time, published by the team's
caller: its pieces' table and its arrays' addresses in shared int64 arrays, a sequence number (odd
while the caller writes a job) telling the spinners a new one is there. A piece is
compiled_linear's piece on the same slice: team.share's bits (tests/test_cpu_linear.py).
"""

from __future__ import annotations

import time

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .compiled_linear import EXACT, _forward_piece, _rule_piece

LINE = 8  # int64s per 64-byte cache line: each hot counter on a line of its own
SEQ, NEXT, DONE, INSIDE, TOTAL, RECALL = (LINE * i for i in range(6))
# args: the job's arrays' addresses, then its sizes
X, W, B, R, OUT, G, DX, DW, DWP, GRADS, DBP = range(11)
ROWS, K, N, GROWS, GCOLS, DWP_N, DBP_N, RESIDUAL = range(11, 19)
# table column 0: which piece function; then the piece's (kind, a, z, slot)
FORWARD, RULE, SUM = 0, 1, 2
MAX_PIECES = 64


@intrinsic
def _load(typingctx, arr, i):
    """arr[i], an atomic (sequentially consistent) load."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(cgutils.gep(builder, ary.data, args[1]), "seq_cst", 8)
    return types.int64(arr, i), codegen


@intrinsic
def _store(typingctx, arr, i, value):
    """arr[i] = value, an atomic (sequentially consistent) store."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        value = context.cast(builder, args[2], signature.args[2], types.int64)
        builder.store_atomic(value, cgutils.gep(builder, ary.data, args[1]), "seq_cst", 8)
        return context.get_dummy_value()
    return types.void(arr, i, value), codegen


@intrinsic
def _add(typingctx, arr, i, value):
    """arr[i] += value atomically; the value before."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        value = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", cgutils.gep(builder, ary.data, args[1]), value, "seq_cst")
    return types.int64(arr, i, value), codegen


@intrinsic
def _relax(typingctx):
    """A spin loop's pause (x86's PAUSE; elsewhere nothing): the core's sibling thread and its
    power are spared while the loop waits."""
    def codegen(context, builder, signature, args):
        if "x86_64" in builder.module.triple:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _address(typingctx, arr):
    """An array's first element's address."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.ptrtoint(ary.data, ir.IntType(64))
    return types.int64(arr), codegen


@intrinsic
def _floats(typingctx, address):
    """The float32 pointer at an address _address gave."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.PointerType(ir.FloatType()))
    return types.CPointer(types.float32)(address), codegen


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
    """A helper's wait between runs: join each job published, spin `spins` turns with none, then
    return (to sleep on its queue); at once when RECALL moves past `since` (a NumPy job waits in
    its queue). state[me·LINE] is 1 while here: the caller puts a token in the queue of a helper
    at 0. Leaving, the helper writes 0 and reads SEQ once more (the caller writes SEQ, then reads
    the states): a job published meanwhile is seen by one of the two."""
    _store(state, me * LINE, 1)
    seen, idle = -1, 0
    while True:
        s = _load(ctl, SEQ)
        if s != seen and s % 2 == 0:
            _add(ctl, INSIDE, 1)
            if _load(ctl, SEQ) == s:  # not rewritten since: its table is this job's
                _pieces(ctl, args, table)
            _add(ctl, INSIDE, -1)
            seen, idle = s, 0
        elif _load(ctl, RECALL) != since:
            _store(state, me * LINE, 0)
            return
        elif idle >= spins:
            _store(state, me * LINE, 0)
            s = _load(ctl, SEQ)
            if s == seen or s % 2 == 1:  # none new (an odd one: its caller reads a 0 after)
                return
            _store(state, me * LINE, 1)
        else:
            idle += 1
            _relax()


@numba.njit(**EXACT)
def _open(ctl, state, helpers):
    """Start writing a job: SEQ odd (spinners keep off), then wait for those still inside the
    last one (they find no piece left) to leave."""
    _add(ctl, SEQ, 1)
    while _load(ctl, INSIDE) != 0:
        _relax()


@numba.njit(**EXACT)
def _close(ctl, state, helpers, total):
    """The job written: its counters reset, SEQ even; a bit set for each of the first `helpers`
    helpers not spinning (the caller wakes them through their queues)."""
    _store(ctl, NEXT, 0)
    _store(ctl, DONE, 0)
    _store(ctl, TOTAL, total)
    _add(ctl, SEQ, 1)
    asleep = 0
    for i in range(helpers):
        if _load(state, i * LINE) == 0:
            asleep |= 1 << i
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
        self.args = np.zeros(RESIDUAL + 1, np.int64)
        self.table = np.zeros((MAX_PIECES, 5), np.int64)
        self.keep: object = None  # the last job's arrays (team.pooled)
        # compiled (or loaded from numba's cache) here, in the caller, so that no helper holds
        # numba's compiler lock when the process forks (the child would wait on it forever);
        # a spare state slot, nothing published, RECALL past `since`: it returns at once
        serve(self.ctl, self.state, self.HELPERS, self.args, self.table, 0, -1)
        _spin(self.ctl, 10)
        turns = 20_000
        start = time.perf_counter()
        _spin(self.ctl, turns)
        per_us = turns / max(1e-9, 1e6 * (time.perf_counter() - start))
        self.spins = self.default_spins = int(spin_us * per_us)

    def recall(self) -> int:
        """Spinners back to their queues (a NumPy job, or a resize, is there): RECALL's new value.
        Only the team's caller writes it."""
        self.ctl[RECALL] += 1
        return int(self.ctl[RECALL])

    def recalls(self) -> int:
        return int(self.ctl[RECALL])

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

    def finish(self) -> None:
        finish(self.ctl, self.args, self.table)

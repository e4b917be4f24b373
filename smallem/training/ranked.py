"""The data-parallel step: each rank reads its rows of the batch (ranks.rows), in `accumulate`
micro-batches; backward seeds each micro-batch's mean loss with its row count, so the buffer
(ranks/buckets.py) sums per-row gradients; the sum over ranks is divided once by the batch, and
every rank makes the same update. On a GPU the sum is NCCL's, recorded in the captured step.
One process with accumulate=1 never comes here (step.py's step).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..autodiff.tape import Tape
from ..backends import Backend, Tensor
from ..backends.precision import LossScaler, all_finite
from ..errors import SmallemError
from ..nn import Module
from ..optim import Optimizer
from ..ranks import Buckets, World, buckets, rows
from .signals import Interrupt
from .step import CapturableOptimizer, CapturedStep, Observer


class RankedStep:
    """`step(contexts, targets)` on this rank's share of the global batch (B rows, every rank
    passes the same batch): the update equals one process's on all B rows, to rounding. The
    loss it returns is the global batch's mean. `interrupt`: a stop asked on any rank (Ctrl-C,
    SIGTERM) is summed with the step, and `agreed` holds it on every rank after the same step:
    the loop stops on `agreed`, never on its own flag (a rank leaving alone would leave the
    others waiting in the next sum). On a GPU (`world` an NcclWorld) the rank's part of the step,
    the all-reduce included, is captured as a CUDA graph unless `capture` is False."""

    def __init__(self, backend: Backend, model: Module, optimizer: Optimizer, world: World, *,
                 accumulate: int = 1, scaler: LossScaler | None = None, overlap: bool = True,
                 interrupt: Interrupt | None = None, bucket_bytes: int | None = None,
                 capture: bool = True) -> None:
        self.backend, self.model, self.optimizer, self.world = backend, model, optimizer, world
        self.accumulate, self.scaler, self.overlap = accumulate, scaler, overlap
        self.bucket_bytes = bucket_bytes or buckets.BUCKET_BYTES  # read now: a test may set it
        self.interrupt = interrupt  # this rank's Ctrl-C or SIGTERM, as its handler set it
        self.agreed = Interrupt()  # a stop any rank asked for, known to all after the same step
        self.buckets: Buckets | None = None
        self.compute_seconds = self.wait_seconds = 0.0  # the last step's split (bench)
        self.device = backend.name == "gpu"
        if self.device and scaler is not None:
            raise SmallemError("fp16's loss scaler is not run across GPU ranks: use --precision "
                               "bf16 (float32's range, no scaler) under --ranks")
        self.batch: int | None = None  # the global batch the captured graph divides by
        self.captured = (CapturedStep(backend, model, optimizer, body=self.body)
                         if self.device and capture and isinstance(optimizer, CapturableOptimizer)
                         else None)

    def pieces(self, rows_here: int) -> list[tuple[int, int]]:
        """This rank's micro-batches as row ranges of its own rows."""
        if rows_here < self.accumulate:
            raise SmallemError(f"--accumulate {self.accumulate} splits a rank's {rows_here} "
                               f"rows of the batch into empty micro-batches: ask for fewer "
                               "micro-batches, or a larger --batch")
        return [rows(rows_here, self.accumulate, k) for k in range(self.accumulate)]

    def __call__(self, contexts: np.ndarray, targets: np.ndarray,
                 observer: Observer | None = None) -> Tensor:
        began = time.perf_counter()
        batch = len(contexts)
        start, stop = rows(batch, self.world.size, self.world.rank)
        mine = contexts[start:stop], targets[start:stop]
        if self.captured is not None and self.batch in (None, batch):
            self.batch = batch
            loss = self.captured(*mine, observer=observer)
        else:
            self.batch = self.batch or batch
            loss = self.body(*mine, observer=observer, batch=batch)
        if self.device and self.world.size > 1:  # the stop flag is the host's: one small sum
            self._agree(float(self.world.host.allreduce(np.array([self._code()]))[0]))
        self.compute_seconds = time.perf_counter() - began - self.wait_seconds
        return loss

    def body(self, contexts: np.ndarray, targets: np.ndarray, observer: Observer | None = None,
             batch: int | None = None) -> Tensor:
        """This rank's rows: forward and backward per micro-batch, the sum over ranks, one
        update. What a GPU captures (every host number in it is the same at every step)."""
        be, batch = self.backend, batch or self.batch
        scale = 1.0 if self.scaler is None else self.scaler.scale
        total = be.zeros(())
        for k, (a, b) in enumerate(self.pieces(len(contexts))):
            tape = Tape(be)
            loss = self.model.loss(tape, contexts[a:b], targets[a:b])
            buckets = self._buckets(tape)
            if k == 0:
                buckets.reset()
            owner = {i: p for p, i in tape.bindings.items()}
            last = k == self.accumulate - 1

            def final(index: int, grad: Any, owner: dict = owner, last: bool = last) -> None:
                if index in owner:
                    buckets.add(owner[index], grad, last)

            seed = be.full(be.shape(tape.value(loss)), float(b - a) * scale)
            with np.errstate(over="ignore", invalid="ignore"):  # fp16's overflow: the scaler's
                grads = tape.backward(loss, seed, on_final=final)
            total = be.add(total, be.mul(tape.value(loss), float(b - a)))
        if self.device:  # the loss sum rides on the device; the stop flag goes on the host
            buckets.flat[-2:-1] = total.reshape(1)
            flat = buckets.finish()
        else:
            flat = buckets.finish([be.item(total), float(self._code())])
            self._agree(float(buckets.tail()[1]))
        self.wait_seconds = buckets.wait_seconds
        for p, i in tape.bindings.items():
            grads.set_node(i, be.tensor(buckets.gradient(p) * (1.0 / (batch * scale))))
        mean = be.mul(be.tensor(flat[-2]), 1.0 / batch)
        if self.scaler is not None and not self.scaler.update(all_finite(be, [flat])):
            return mean  # every rank sees the same sums: every rank skips
        if observer is not None:
            observer.after_backward(tape, loss, grads)
        self.optimizer.step(self.model.parameters(), grads)
        if observer is not None:
            observer.after_update()
        return mean

    def _buckets(self, tape: Tape) -> Buckets:
        """The buffer, laid out on the first step from the order backward finishes the
        parameters in: the last bound first (the same order on every rank: the same code)."""
        if self.buckets is None:
            order = sorted(tape.bindings.items(), key=lambda kv: -kv[1])
            self.buckets = Buckets(self.world, [(p, p.shape) for p, _ in order],
                                   self.backend.dtype, extras=2, overlap=self.overlap,
                                   bucket_bytes=self.bucket_bytes,
                                   xp=_cupy() if self.device else np)
        return self.buckets

    def _code(self) -> int:
        """This rank's stop request as a number the sum keeps: its signal, 0 for none."""
        asked = self.interrupt is not None and self.interrupt.requested
        return int(self.interrupt.signum) if asked else 0

    def _agree(self, total: float) -> None:
        if total:  # SIGTERM when any rank had it (the sum reaches 15), else SIGINT
            self.agreed.requested = True
            self.agreed.signum = signal.SIGTERM if total >= signal.SIGTERM else signal.SIGINT


def _cupy() -> Any:
    import cupy

    return cupy


def check_same_run(world: World, values: dict[str, Any], batch: int, accumulate: int) -> None:
    """Refuse, on every rank at once, a run whose ranks were started with other settings or
    another corpus than rank 0's, naming the first field that differs, or whose batch leaves a
    rank or a micro-batch without rows. The error is `quiet` on ranks other than 0: every rank
    raises the same sentence, rank 0 says it (a command line prints it once)."""
    everyone: Sequence[dict[str, Any]] = world.allgather(values)
    mine = everyone[0]
    try:
        for rank, theirs in enumerate(everyone[1:], 1):
            for name, value in mine.items():
                if theirs.get(name) != value:
                    raise SmallemError(f"rank {rank} was started with {name} "
                                       f"{theirs.get(name)!r} and rank 0 with {value!r}: start "
                                       "every rank with the same command line and corpus")
        fewest = batch // world.size if world.size <= batch else rows(batch, world.size, 0)[1]
        if fewest < accumulate:
            raise SmallemError(f"--accumulate {accumulate} splits the {fewest} "
                               f"row{'s' * (fewest != 1)} a rank reads of the batch of {batch} "
                               "into empty micro-batches: ask for "
                               "fewer micro-batches, or a larger --batch")
    except SmallemError as error:
        error.quiet = world.rank != 0  # type: ignore[attr-defined]
        raise

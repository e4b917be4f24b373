"""The data-parallel step: each rank reads its rows of the batch (ranks.rows), in `accumulate`
micro-batches; backward seeds each micro-batch's mean loss with its row count, so the buffer
(ranks/buckets.py) sums per-row gradients; the sum over ranks is divided once by the batch, and
every rank makes the same update. One process with accumulate=1 never comes here (step.py's).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..autodiff.tape import Tape
from ..backends import Backend, Tensor
from ..backends.precision import LossScaler, all_finite
from ..errors import SmallemError
from ..nn import Module
from ..optim import Optimizer
from ..ranks import BUCKET_BYTES, Buckets, World, rows
from .signals import Interrupt
from .step import Observer


class RankedStep:
    """`step(contexts, targets)` on this rank's share of the global batch (B rows, every rank
    passes the same batch): the update equals one process's on all B rows, to rounding. The
    loss it returns is the global batch's mean. `interrupt`: a stop asked on any rank (Ctrl-C,
    SIGTERM) rides in the sum, and `agreed` holds it on every rank after the same step: the
    loop stops on `agreed`, never on its own flag (a rank leaving alone would leave the others
    waiting in the next sum)."""

    def __init__(self, backend: Backend, model: Module, optimizer: Optimizer, world: World, *,
                 accumulate: int = 1, scaler: LossScaler | None = None, overlap: bool = True,
                 interrupt: Interrupt | None = None, bucket_bytes: int = BUCKET_BYTES) -> None:
        if backend.name == "gpu":
            raise SmallemError("ranks on the GPU run through NCCL, which this step does not drive "
                               "yet: train with --backend cpu or cpu64 under --ranks")
        self.backend, self.model, self.optimizer, self.world = backend, model, optimizer, world
        self.accumulate, self.scaler, self.overlap = accumulate, scaler, overlap
        self.bucket_bytes = bucket_bytes
        self.interrupt = interrupt  # this rank's Ctrl-C or SIGTERM, as its handler set it
        self.agreed = Interrupt()  # a stop any rank asked for, known to all after the same step
        self.buckets: Buckets | None = None
        self.compute_seconds = self.wait_seconds = 0.0  # the last step's split (bench)

    def pieces(self, batch: int) -> list[tuple[int, int]]:
        """This rank's micro-batches as row ranges of the global batch."""
        start, stop = rows(batch, self.world.size, self.world.rank)
        if stop - start < self.accumulate:
            raise SmallemError(f"--accumulate {self.accumulate} splits a rank's {stop - start} "
                               f"rows of the batch of {batch} into empty micro-batches: ask for "
                               "fewer micro-batches, or a larger --batch")
        return [(start + a, start + b)
                for a, b in (rows(stop - start, self.accumulate, k) for k in range(self.accumulate))]

    def _buckets(self, tape: Tape) -> Buckets:
        """The buffer, laid out on the first step from the order backward finishes the
        parameters in: the last bound first (the same order on every rank: the same code)."""
        if self.buckets is None:
            order = sorted(tape.bindings.items(), key=lambda kv: -kv[1])
            self.buckets = Buckets(self.world, [(p, p.shape) for p, _ in order],
                                   self.backend.dtype, extras=2, overlap=self.overlap,
                                   bucket_bytes=self.bucket_bytes)
        return self.buckets

    def __call__(self, contexts: np.ndarray, targets: np.ndarray,
                 observer: Observer | None = None) -> Tensor:
        import time

        began = time.perf_counter()
        be, batch = self.backend, len(contexts)
        pieces = self.pieces(batch)
        loss_sum, scale = 0.0, 1.0 if self.scaler is None else self.scaler.scale
        for k, (a, b) in enumerate(pieces):
            tape = Tape(be)
            loss = self.model.loss(tape, contexts[a:b], targets[a:b])
            buckets = self._buckets(tape)
            if k == 0:
                buckets.reset()
            owner = {i: p for p, i in tape.bindings.items()}
            last = k == len(pieces) - 1

            def final(index: int, grad: Any, owner: dict = owner, last: bool = last) -> None:
                if index in owner:
                    buckets.add(owner[index], grad, last)

            seed = be.full(be.shape(tape.value(loss)), float(b - a) * scale)
            with np.errstate(over="ignore", invalid="ignore"):  # fp16's overflow: the scaler's
                grads = tape.backward(loss, seed, on_final=final)
            loss_sum += be.item(tape.value(loss)) * (b - a)
        stop = bool(self.interrupt and self.interrupt.requested)
        flat = buckets.finish([loss_sum, float(stop) * self.interrupt_code()])
        total_loss, stopped = buckets.tail()
        self.wait_seconds = buckets.wait_seconds
        if stopped:
            self.agreed.requested, self.agreed.signum = True, self.code_signal(stopped)
        for p, i in tape.bindings.items():
            grads.set_node(i, be.tensor(buckets.gradient(p) * (1.0 / (batch * scale))))
        loss_value = be.tensor(np.asarray(total_loss / batch, dtype=be.dtype))
        if self.scaler is not None and not self.scaler.update(all_finite(be, [flat])):
            return loss_value  # every rank sees the same sums: every rank skips
        if observer is not None:
            observer.after_backward(tape, loss, grads)
        self.optimizer.step(self.model.parameters(), grads)
        if observer is not None:
            observer.after_update()
        self.compute_seconds = time.perf_counter() - began - self.wait_seconds
        return loss_value

    def interrupt_code(self) -> int:
        """The signal a stop was asked with, as a number the sum keeps (several: the largest)."""
        return int(self.interrupt.signum) if self.interrupt is not None else 0

    @staticmethod
    def code_signal(total: float) -> int:
        """A signal number from the summed codes: SIGTERM when any rank had it, else SIGINT."""
        return signal.SIGTERM if total >= signal.SIGTERM else signal.SIGINT


def check_same_run(world: World, values: dict[str, Any]) -> None:
    """Refuse, on every rank at once, a run whose ranks were started with other settings or
    another corpus than rank 0's, naming the first field that differs."""
    everyone: Sequence[dict[str, Any]] = world.allgather(values)
    mine = everyone[0]
    for rank, theirs in enumerate(everyone[1:], 1):
        for name, value in mine.items():
            if theirs.get(name) != value:
                raise SmallemError(f"rank {rank} was started with {name} {theirs.get(name)!r} "
                                   f"and rank 0 with {value!r}: start every rank with the same "
                                   "command line and corpus")

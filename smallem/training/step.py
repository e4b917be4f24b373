"""One training step: forward, backward, update, plain or captured once and replayed.

`train_step` knows nothing of the model: it takes a function that builds the loss on a fresh
tape. On a GPU, a step driven by the Python tape costs ~20 kernel launches of 15-50 µs of host
time each while the arithmetic takes a few µs: the GPU waits on Python. `CapturedStep` records
one whole step on the tape as usual, but under CUDA stream capture, so its kernels become a
graph; every later step copies the new batch into the graph's fixed input buffers and replays
the graph in one launch. The same kernels run in the same order, so the losses are the plain
step's. train.py's loop calls `make_step`'s result and nothing else.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..autodiff.tape import Gradients, Tape, Var
from ..backends import Backend, Tensor
from ..backends.precision import LossScaler, all_finite
from ..errors import SmallemError
from ..nn import Module, Parameter
from ..optim import Optimizer


class Observer(Protocol):
    """Looks at training from inside a step (health.py's statistics): `wants(step)` says on
    which steps; then `after_backward` sees the tape and the gradients before the update, and
    `after_update` the parameters after it. What the loop gives it besides: `on_history` the
    records made before this session's first step (step 0's held-out loss; a resumed run's
    whole history), once, and `on_record` each history record made after that."""

    def wants(self, step: int) -> bool: ...
    def after_backward(self, tape: Tape, loss: Var, grads: Gradients) -> None: ...
    def after_update(self) -> None: ...
    def on_history(self, records: Sequence[dict[str, Any]]) -> None: ...
    def on_record(self, record: dict[str, Any]) -> None: ...


def loss_and_gradients(backend: Backend | str, loss_fn: Callable[[Tape], Var]
                       ) -> tuple[Tensor, Gradients]:
    """Build the loss on a new tape and run backward: (loss as a tensor, gradients)."""
    tape = Tape(backend)
    loss = loss_fn(tape)
    return tape.value(loss), tape.backward(loss)


def train_step(backend: Backend | str, model: Module, optimizer: Optimizer,
               loss_fn: Callable[[Tape], Var], *, observer: Observer | None = None,
               scaler: LossScaler | None = None) -> Tensor:
    """Forward, backward, update. The loss comes back as a backend tensor, unread: reading a
    GPU number waits for the GPU, so the loop reads it only when it logs. No zero_grad: the
    gradients belong to this step's Gradients and go with it. With a `scaler` (fp16), backward
    starts from the loss scale instead of 1, and a step whose gradients overflowed is skipped."""
    tape = Tape(backend)
    loss = loss_fn(tape)
    if scaler is None:
        grads = tape.backward(loss)
    else:
        scale = scaler.scale  # the update below may change it
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is the scaler's to handle
            grads = tape.backward(loss, np.full(tape.value(loss).shape, scale))
    if scaler is not None:
        leaves = [grads.node(i) for i in grads.bindings.values()]
        if not scaler.update(all_finite(tape.backend, leaves)):
            tape.close()
            return tape.value(loss)  # skipped: the parameters keep their values
        grads.scale_parameters(1.0 / scale)
    if observer is not None:
        observer.after_backward(tape, loss, grads)
    optimizer.step(model.parameters(), grads)
    if observer is not None:
        observer.after_update()
    return tape.value(loss)



Step = Callable[..., Tensor]  # (contexts, targets, observer=None) -> loss tensor, unread


@runtime_checkable
class CapturableOptimizer(Protocol):
    """What CapturedStep needs of an optimizer, beyond Optimizer's `step`, `count_step` and
    `max_norm` (a clipping optimizer reads the global norm on the host, so it is never captured).

    A recorded update replays with every host number frozen into the graph, so whatever changes
    from step to step must be read from device memory: `corrections_per_parameter` floats per
    parameter (AdamW's 1 − β1ᵗ and 1 − β2ᵗ; SGD none), written by `write_corrections` into the
    graph's input buffer before each replay, and read by the update recorded inside
    `reading_corrections(device)`. Recording also runs the host bookkeeping of an update that
    may never happen: `snapshot()` and `restore()` put the counters back if capture fails."""

    max_norm: float | None
    corrections_per_parameter: int
    steps: int  # updates applied so far: none yet, and the optimizer's state is not made yet

    def count_step(self, parameters: Sequence[Parameter]) -> None: ...
    def snapshot(self) -> Any: ...
    def restore(self, snapshot: Any) -> None: ...
    def write_corrections(self, parameters: Sequence[Parameter], out: np.ndarray) -> None: ...
    def reading_corrections(self, device: Any) -> AbstractContextManager[None]: ...


def plain_step(backend: Backend, model: Module, optimizer: Optimizer,
               scaler: LossScaler | None = None) -> Step:
    """The step as the tape runs it: forward, backward, update, one launch at a time."""

    def step(contexts: np.ndarray, targets: np.ndarray, observer: Observer | None = None
             ) -> Tensor:
        return train_step(backend, model, optimizer,
                          lambda tape: model.loss(tape, contexts, targets), observer=observer,
                          scaler=scaler)

    return step


class CapturedStep:
    """`step(contexts, targets)` on a GPU backend, replayed from a CUDA graph after its first
    calls. The plain step runs instead on the first call (it compiles the kernels and creates
    the optimizer's moments), when an observer wants to look inside the step (it reads the
    device), when the optimizer clips gradients (the global norm is read on the host), for a
    batch of another shape than the captured one, and for good if capturing fails.

    Each call returns its own loss: a new device scalar, copied from the graph's loss buffer
    right after the replay, on the same stream (the buffer itself is rewritten by the next
    replay), so `losses.append(step(x, y))` keeps every loss, as with the plain step."""

    def __init__(self, backend: Backend, model: Module, optimizer: CapturableOptimizer,
                 scaler: LossScaler | None = None, body: Step | None = None) -> None:
        import cupy

        self.cupy, self.backend, self.model, self.optimizer = cupy, backend, model, optimizer
        # What is run plain and recorded: the plain step, or `body` (a data-parallel rank's
        # part of the step, its all-reduce included: training/ranked.py, which runs no scaler)
        self.plain = body or plain_step(backend, model, optimizer, scaler)
        self.scaler = scaler  # fp16: its rule runs on the device in the graph (scaled.py)
        self.scaled: Any = None
        self.parameters = model.parameters()
        self.vocab = model.config.vocab
        self.calls = 0
        self.graph: Any = None  # the graph, and the memory pool its tensors live in
        self.failed: str | None = None  # why capturing did not work, if it did not
        self.replays = 0

    def capturable(self, contexts: np.ndarray, targets: np.ndarray,
                   observer: Observer | None) -> bool:
        if self.failed or observer is not None or self.optimizer.max_norm:
            return False
        if self.graph is not None:
            return (contexts.shape, targets.shape) == self.shapes
        # The first call runs plain, and so does every call until an update was applied (an fp16
        # step may be skipped): that update creates the optimizer's state, outside the graph.
        return self.calls > 0 and self.optimizer.steps > 0

    def __call__(self, contexts: np.ndarray, targets: np.ndarray,
                 observer: Observer | None = None) -> Tensor:
        contexts, targets = np.asarray(contexts), np.asarray(targets)
        if not self.capturable(contexts, targets, observer):
            self.calls += 1
            if self.scaled is None:
                return self.plain(contexts, targets, observer)
            self.scaled.settle()  # the plain step reads and updates the host's scaler
            loss = self.plain(contexts, targets, observer)
            self.scaled.push()
            return loss
        self.calls += 1
        self._check(contexts, targets)
        if self.graph is None:
            counts = self.optimizer.snapshot()
            try:
                self._capture(contexts, targets)
            except Exception as error:  # a CuPy or driver without what capture needs
                # Recording ran the optimizer's bookkeeping for an update that never happened.
                self.optimizer.restore(counts)
                if self.scaled is not None:
                    self.scaled.release()
                    self.scaled = None
                self.failed = f"{type(error).__name__}: {error}"
                warnings.warn(f"the GPU step could not be captured ({self.failed}); training "
                              "goes on with the plain step", RuntimeWarning, stacklevel=2)
                return self.plain(contexts, targets)
        return self._replay(contexts, targets)

    def _check(self, contexts: np.ndarray, targets: np.ndarray) -> None:
        """The host batch is checked before it is uploaded: the graph reads the device copy
        and cannot check it (a token outside the table would read garbage, not fail)."""
        for name, x in (("contexts", contexts), ("targets", targets)):
            if not np.issubdtype(x.dtype, np.integer) or (
                    self.vocab and x.size and (x.min() < 0 or x.max() >= self.vocab)):
                raise SmallemError(f"the batch's {name} must be integers in [0, {self.vocab})")

    def _capture(self, contexts: np.ndarray, targets: np.ndarray) -> None:
        cupy, be = self.cupy, self.backend
        self.shapes = (contexts.shape, targets.shape)
        # The graph's inputs: one device buffer, filled by one copy per step, viewed as the
        # contexts, the targets and the optimizer's per-step numbers (AdamW's bias corrections):
        # one copy, not three, as each copy is a few µs of the GPU's time before the graph starts.
        # With a scaler the bias corrections are the device's to write (a skip leaves t as it is).
        per = 0 if self.scaler is not None else self.optimizer.corrections_per_parameter
        sizes = [contexts.size * 8, targets.size * 8, 4 * per * len(self.parameters)]
        self.inputs = cupy.zeros(sum(sizes), dtype=np.uint8)
        self.host = np.zeros(sum(sizes), dtype=np.uint8)
        ends = np.cumsum(sizes)
        self.parts = [slice(0, ends[0]), slice(ends[0], ends[1]), slice(ends[1], ends[2])]
        self.contexts = self.inputs[self.parts[0]].view(np.int64).reshape(contexts.shape)
        self.targets = self.inputs[self.parts[1]].view(np.int64).reshape(targets.shape)
        corrections = self.inputs[self.parts[2]].view(np.float32)
        loss_fn = lambda tape: self.model.loss(tape, self.contexts, self.targets)
        step = lambda: self.plain(self.contexts, self.targets)
        if self.scaler is not None:
            from .scaled import ScaledCapture

            self.scaled = scaled = ScaledCapture(self.optimizer, self.parameters, self.scaler)
            scaled.push()
            corrections = scaled.device.corrections
            step = lambda: scaled.step(be, self.model, loss_fn)
        self.stream = cupy.cuda.Stream()
        be.synchronize()
        with self.optimizer.reading_corrections(corrections), be.capture(self.stream) as graph:
            self.loss = step()
        # Recording ran the optimizer's host bookkeeping once, for the step replayed now.
        self.graph, self.replays = graph, -1

    def _replay(self, contexts: np.ndarray, targets: np.ndarray) -> Tensor:
        if self.replays >= 0:  # the capture itself counted its own step
            self.optimizer.count_step(self.parameters)
        self.replays += 1
        host, (c, t, s) = self.host, self.parts
        host[c].view(np.int64)[:] = contexts.reshape(-1)
        host[t].view(np.int64)[:] = targets.reshape(-1)
        if self.scaled is None:  # with a scaler, the device writes them (scaled.py)
            self.optimizer.write_corrections(self.parameters, host[s].view(np.float32))
        self.backend.upload_into(self.inputs, host)
        stream = self.cupy.cuda.get_current_stream()
        self.graph[0].launch(stream=stream)
        return fresh_copy(self.cupy, self.loss, stream)


def fresh_copy(cupy: Any, value: Any, stream: Any) -> Any:
    """A new device array holding `value` as it is once the work queued on `stream` is done:
    one device-to-device copy queued behind it, no wait for the GPU."""
    out = cupy.ndarray(value.shape, value.dtype)
    if value.nbytes:
        cupy.cuda.runtime.memcpyAsync(out.data.ptr, value.data.ptr, value.nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
    return out


def make_step(backend: Backend, model: Module, optimizer: Optimizer, *, capture: bool = True,
              scaler: LossScaler | None = None) -> Step:
    """The step function a loop calls: captured on a GPU backend unless told not to (or the
    optimizer does not meet CapturableOptimizer), plain everywhere else. fp16's LossScaler is
    captured too (its rule runs on the device: scaled.py); a scaler with a rule of its own (a
    subclass: lesson 14's) is read on the host, so that step runs plain."""
    attach_scaler(optimizer, scaler)
    if (capture and backend.name == "gpu" and (scaler is None or type(scaler) is LossScaler)
            and isinstance(optimizer, CapturableOptimizer)):
        return CapturedStep(backend, model, optimizer, scaler)
    return plain_step(backend, model, optimizer, scaler)


def attach_scaler(optimizer: Optimizer, scaler: LossScaler | None) -> None:
    """The scaler rides in the optimizer's checkpoint state (optim.py): a resumed run's
    optimizer holds the state saved, which the scaler takes over here."""
    if scaler is None or not hasattr(optimizer, "loss_scaler"):
        return
    optimizer.loss_scaler = scaler
    if optimizer.loss_scaler_state is not None:
        scaler.load_state(optimizer.loss_scaler_state)

"""fp16's loss scaler inside a captured step (step.py's CapturedStep records this step).

The plain fp16 step reads every step's verdict on the host (finite gradients or not), which a CUDA
graph cannot. Recorded here instead: backward seeded from the scale in device memory, a kernel that
flags an inf or NaN among the gradients, one that applies LossScaler's rule to the flag, and the
update gated by its verdict (backends/cuda/scaler.py). The host's LossScaler and the optimizer's
step counts are brought back from the device only when someone reads them (`settle`: a
checkpoint, a plain step in between), so replays never wait for the GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..autodiff.tape import Tape, Var
from ..backends import Backend, Tensor
from ..backends.precision import LossScaler
from ..nn import Module, Parameter


class ScaledCapture:
    """The device side of one captured step's LossScaler, and the bookkeeping between them."""

    def __init__(self, optimizer: Any, parameters: Sequence[Parameter], scaler: LossScaler) -> None:
        from ..backends.cuda.scaler import DeviceScaler

        self.optimizer, self.parameters, self.scaler = optimizer, list(parameters), scaler
        self.adamw = optimizer.corrections_per_parameter > 0  # AdamW: t and 1 − βᵗ on the device
        self.device = DeviceScaler(len(self.parameters) if self.adamw else 0)
        self.known_skips = scaler.skipped  # the skips the host's step counts already leave out
        scaler.settle = self.settle

    def push(self) -> None:
        """The host's state to the device (before the recording, and after a plain step)."""
        s, t = self.scaler, getattr(self.optimizer, "t", {})
        self.device.push(s.scale, s.clean, s.skipped,
                         [t.get(p, 0) for p in self.parameters] if self.adamw else [])
        self.known_skips = s.skipped

    def settle(self) -> None:
        """The device's state back to the host: the scaler's, and the optimizer's counts, which
        counted every replay as an update (waits for the GPU)."""
        scale, clean, skipped = self.device.pull()
        new = skipped - self.known_skips
        if new:
            self.optimizer.steps -= new
            for p in self.parameters:
                if p in getattr(self.optimizer, "t", {}):
                    self.optimizer.t[p] -= new
        self.scaler.scale, self.scaler.clean, self.scaler.skipped = scale, clean, skipped
        self.known_skips = skipped

    def release(self) -> None:
        self.scaler.settle = None

    def step(self, backend: Backend, model: Module, loss_fn: Callable[[Tape], Var]) -> Tensor:
        """train_step with its scaler on the device: what the graph records."""
        from ..backends.cuda.scaler import as_contiguous

        tape = Tape(backend)
        loss = loss_fn(tape)
        grads = tape.backward(loss, self.device.seed)  # the scale, read when the graph runs
        leaves = [grads.node(i) for i in grads.bindings.values()]
        self.device.check([as_contiguous(g) for g in leaves if g is not None])
        self.device.decide(self.scaler.interval, getattr(self.optimizer, "beta1", 0.0),
                           getattr(self.optimizer, "beta2", 0.0))
        backend.update_gate = self.device.gate  # apply?, 1/scale: read by the update kernels
        try:
            self.optimizer.step(model.parameters(), grads)
        finally:
            backend.update_gate = None
        return tape.value(loss)

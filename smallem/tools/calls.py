"""Where a step's time goes: the backend calls of one training step, counted by a stand-in
backend (on a GPU, each call is at least one kernel launch, and its host time is what a captured
graph removes); with every reference rule, with the backend's fused set, or with the GPU's."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..backends import get_backend
from ..backends.cuda import fused_names
from ..data import VOCAB
from ..optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
from ..training import registry
from ..training.step import make_step


class CallCounter:
    """A backend that passes every call through to `backend`, counting it and its host time:
    what the tape and the optimizer ask of a backend in one step. On a GPU each such call is
    (at least) one kernel launch, and its host time is what a captured graph removes."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.calls: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()
        self.fused = {name: self._counted(name, fn, True) for name, fn in backend.fused.items()}
        self.fused_forward = {name: self._counted(name + " (forward)", fn, True)
                              for name, fn in backend.fused_forward.items()}

    def _counted(self, name: str, fn: Callable[..., Any], fused: bool = False
                 ) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if fused and out is None:  # declined: the reference's own calls are counted
                return out
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1
            return out

        return call

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._backend, name)
        return self._counted(name, attribute) if callable(attribute) else attribute

    def reset(self) -> None:
        self.calls.clear()
        self.seconds.clear()


# Calls that only look (a shape) or hand a device array back unchanged, and launch nothing.
NO_LAUNCH = {"shape", "tensor", "indices", "item", "synchronize", "to_numpy", "reshape",
             "transpose", "broadcast_to"}


GPU_FUSED = fused_names()  # what the GPU backend fuses, read from its kernel room's one table
# What the GPU's fused rules take (the rest decline): a Linear's matmul, a bias add.
_GPU_TAKES = {"matmul": lambda sa, sb: len(sb) == 2 and len(sa) >= 3,
              "add": lambda sa, sb: len(sb) < len(sa)}


def step_calls(backend_name: str = "cpu", batch: int | None = None, seed: int = 0,
               model: str = "mlp", fused: bool | Sequence[str] = True
               ) -> tuple[Counter[str], Counter[str]]:
    """The backend calls of one training step (AdamW; the MLP at batch 256, or the Transformer
    at 64 × its context) and their host seconds, counted on the second step (the first creates
    the optimizer's moments). `fused=False` hides the backend's fused kernels: every reference
    rule runs, as on a backend that has none. `fused=GPU_FUSED` (names) counts as on a backend
    that fuses those: each such rule and operation forward one call (its reference runs
    uncounted), whatever this backend has."""
    counter = CallCounter(get_backend(backend_name))
    if fused is False:
        counter.fused, counter.fused_forward = {}, {}
    elif fused is not True:
        _fuse_as_one_call(counter, fused)
    entry = registry.get(model)
    net = entry.build(entry.bench_config("gpu" if backend_name == "gpu" else "cpu"), counter, seed)
    optimizer = AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY)
    step = make_step(counter, net, optimizer, capture=False)
    rng = np.random.default_rng(seed)
    b, t = batch or entry.batch, net.config.context
    # A sequence model predicts every position's next byte, a windows model the byte after it.
    shape = (b, t) if entry.reads == registry.SEQUENCES else (b,)
    batches = [(rng.integers(0, VOCAB, (b, t)), rng.integers(0, VOCAB, shape)) for _ in range(2)]
    step(*batches[0])
    counter._backend.synchronize()
    counter.reset()
    step(*batches[1])
    counter._backend.synchronize()  # the GPU's queued work counted in nobody's host time
    return Counter(counter.calls), Counter(counter.seconds)


def _fuse_as_one_call(counter: CallCounter, names: Sequence[str]) -> None:
    """Every reference rule, and operation forward, of `names` counted as one call."""
    from ..autodiff.operations import OPERATIONS
    from ..autodiff.primitives import RULES
    from ..autodiff.tape import unbroadcast

    raw = counter._backend

    def rule(name: str) -> Callable[..., tuple]:
        def fused(be: Any, grad: Any, out: Any, *inputs_and_args: Any) -> tuple | None:
            takes = _GPU_TAKES.get(name)
            if takes and not takes(*(raw.shape(x) for x in inputs_and_args[:2])):
                return None
            grads = RULES[name](raw, grad, out, *inputs_and_args)
            # a fused rule hands back each input's own shape (a weight's gradient summed)
            return tuple(g if g is None else unbroadcast(raw, g, raw.shape(x))
                         for g, x in zip(grads, inputs_and_args))

        return fused

    counter.on_request = frozenset()  # as the GPU: every fused node recorded without asking
    counter.fused = {n: counter._counted(n, rule(n), True) for n in names if n in RULES}
    counter.fused_forward = {
        n: counter._counted(n + " (forward)", lambda be, *args: args[-1].forward(raw, *args[:-1]))
        for n in names if n in OPERATIONS}



"""Optimizers: how parameters move once backward has given their gradients.

Both update every parameter in place through one backend method each (`sgd_update`,
`adamw_update`), so a GPU backend runs an update of all parameters as one fused launch. An
optimizer knows parameters, not models; its state is saved by parameter name for checkpoints.
Clipping by the global norm is the optimizers' (`max_norm`), and so are the norms it reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

import numpy as np

from .autodiff.tape import Gradients, Var
from .backends import Backend, Tensor, get_backend
from .errors import SmallemError, require
from .nn import Parameter

Named = Sequence[tuple[str, Parameter]]

# AdamW's own defaults, each written here once (PyTorch's too): what each model trains best with
# is measured, and lives with the model's entry in training/registry.py.
ADAMW_LR = 1e-3
ADAMW_BETAS = (0.9, 0.999)  # the decay of the running means of g and g² (Kingma & Ba, 2015)
ADAMW_EPS = 1e-8  # added to √v̂: a parameter whose gradients are all 0 does not divide by 0
# Decay 0 vs 0.01 at lr 1e-3: within 0.002 of held-out loss; 0.1 worse by 0.06-0.13.
ADAMW_WEIGHT_DECAY = 0.01


class Optimizer(Protocol):
    lr: float
    max_norm: float | None  # clip gradients to this global norm first (None: never)
    steps: int  # updates made

    def step(self, parameters: Sequence[Parameter], gradients: Gradients) -> None: ...
    def count_step(self, parameters: Sequence[Parameter]) -> None: ...
    def state_dict(self, named: Named) -> dict[str, Any]: ...
    def load_state_dict(self, named: Named, state: dict[str, Any]) -> None: ...


def with_gradients(parameters: Sequence[Parameter], gradients: Gradients
                   ) -> list[tuple[Parameter, Tensor]]:
    """The (parameter, gradient) pairs to update, after checking that no open tape still reads
    a parameter. A parameter the loss did not use has no gradient and is left alone; when none
    has one, the gradients surely come from another tape than the one that read them."""
    pairs = []
    for p in parameters:
        p.check_writable()
        g = p.grad(gradients)
        if g is not None:
            pairs.append((p, g))
    if parameters and not pairs:
        raise SmallemError(
            f"none of these {len(parameters)} parameters was read on tape #{gradients.tape_id}, "
            "the one these gradients come from: call the optimizer right after backward, with "
            "the gradients of the tape the model's loss was built on")
    gradients.applied = True  # their tape's activations no longer match: no repeat backward
    return pairs


# clipping by the global norm -------------------------------------------------------------
def global_norm(backend: Backend | str, tensors: Sequence[Tensor | None]) -> float:
    """√(Σ ‖g‖²) over every tensor of the list, as if they were one long vector (None skipped).

    Each tensor is divided by its largest |element| before squaring, and the parts are added
    on the host in float64: a float32 gradient of norm 1e20, exactly the kind clipping exists
    for, would otherwise square to inf."""
    be = get_backend(backend)
    total = 0.0
    for g in tensors:
        if g is None:
            continue
        flat = be.reshape(g, (-1,))
        if be.shape(flat)[0] == 0:
            continue
        peak = be.item(be.max(be.abs(flat), 0))
        if not np.isfinite(peak):
            return peak if np.isnan(peak) else float("inf")
        if peak > 0:
            total += peak * peak * be.item(be.sum(be.square(be.div(flat, peak))))
    return float(np.sqrt(total))


def clip_by_global_norm(backend: Backend | str, grads: Sequence[Tensor | None],
                        max_norm: float) -> tuple[list[Tensor | None], float]:
    """Scale every gradient by the same factor min(1, max_norm / global norm).

    Returns the clipped list (None entries stay None) and the norm before clipping. One
    common factor keeps the direction of the whole step and bounds its length: a step of
    SGD can then move the parameters by at most lr·max_norm, however steep the cliff."""
    require("the clipping norm", max_norm, "positive")
    be = get_backend(backend)
    total = global_norm(be, grads)
    if not np.isfinite(total):
        # An inf or nan gradient has no direction to keep; scaling would spread nan everywhere.
        raise SmallemError(f"clip_by_global_norm: the gradient norm is {total}: a gradient holds "
                           "inf or nan, which no scaling repairs; clip from the first step, or "
                           "lower the learning rate")
    if total <= max_norm:
        return list(grads), total
    scale = max_norm / total
    return [None if g is None else be.mul(g, scale) for g in grads], total


def gradient_norms(grads: Gradients, variables: Sequence[Var]) -> list[float]:
    """‖d loss / d v‖ for each Var `v`, in order: per layer, per time step, per parameter."""
    return [global_norm(v.tape.backend, [grads[v]]) for v in variables]


def _clip(pairs: list[tuple[Parameter, Tensor]], max_norm: float | None
          ) -> tuple[list[tuple[Parameter, Tensor]], float | None]:
    """Scale all gradients by one factor so that their global norm is at most `max_norm`
    (clip_by_global_norm). Reading the norm syncs a GPU: clipping is opt-in."""
    if max_norm is None or not pairs:
        return pairs, None
    grads, norm = clip_by_global_norm(pairs[0][0].backend, [g for _, g in pairs], max_norm)
    return [(p, g) for (p, _), g in zip(pairs, grads)], norm


def _by_backend(pairs: list[tuple[Parameter, Tensor]]
                ) -> list[tuple[Any, list[tuple[Parameter, Tensor]]]]:
    """The (parameter, gradient) pairs grouped by backend, in order (one group for a model)."""
    groups: dict[int, tuple[Any, list[tuple[Parameter, Tensor]]]] = {}
    for p, g in pairs:
        groups.setdefault(id(p.backend), (p.backend, []))[1].append((p, g))
    return list(groups.values())


def _check_names(kind: str, named: Named, tensors: dict[str, np.ndarray], slots: Sequence[str]
                 ) -> None:
    names = {n for n, _ in named}
    stored = {k.rsplit(".", 1)[0] for k in tensors}
    extra = sorted(stored - names)
    if extra:
        raise SmallemError(f"{kind} state holds {extra[0]!r}, which the model does not have")
    for name, p in named:
        for slot in slots:
            key = f"{name}.{slot}"
            if key in tensors and tuple(tensors[key].shape) != p.shape:
                raise SmallemError(f"{kind} state for {name!r} has shape "
                                   f"{list(tensors[key].shape)}, the parameter {list(p.shape)}")


def _scaler_meta(optimizer: Any) -> dict[str, Any]:
    """The loss scaler an fp16 run steps with, for the optimizer's checkpoint state: which updates
    are applied is part of the update rule, so a resumed run continues with the scale reached."""
    scaler = optimizer.loss_scaler
    return {} if scaler is None else {"loss_scaler": scaler.state()}


def _load_scaler(optimizer: Any, meta: dict[str, Any]) -> None:
    """The saved scaler state, into the scaler attached (training.step.make_step attaches one
    later: it finds the state waiting in `loss_scaler_state`)."""
    optimizer.loss_scaler_state = meta.get("loss_scaler")
    if optimizer.loss_scaler is not None and optimizer.loss_scaler_state is not None:
        optimizer.loss_scaler.load_state(optimizer.loss_scaler_state)


class SGD:
    """p ← p − lr·g: the same step size for every parameter."""

    def __init__(self, lr: float, max_norm: float | None = None) -> None:
        self.lr = float(require("the learning rate", lr, "positive"))
        self.max_norm = require("the clipping norm", max_norm, "positive", optional=True)
        self.last_norm: float | None = None  # the global gradient norm before clipping
        self.steps = 0
        self.loss_scaler: Any = None  # fp16's LossScaler, saved with this state (make_step)
        self.loss_scaler_state: dict[str, Any] | None = None  # loaded, for a scaler not yet attached

    def step(self, parameters: Sequence[Parameter], gradients: Gradients) -> None:
        pairs, self.last_norm = _clip(with_gradients(parameters, gradients), self.max_norm)
        # One call per backend for all parameters: the GPU backend updates them in one launch.
        for backend, group in _by_backend(pairs):
            backend.sgd_update([p.value for p, _ in group], [g for _, g in group], lr=self.lr)
        self.count_step([p for p, _ in pairs])

    def count_step(self, parameters: Sequence[Parameter]) -> None:
        """The host's account of one update of `parameters` (a replayed graph made it)."""
        self.steps += 1

    # what a captured step needs (training.step.CapturableOptimizer): SGD reads nothing per step
    corrections_per_parameter = 0

    def snapshot(self) -> int:
        return self.steps

    def restore(self, snapshot: int) -> None:
        self.steps = snapshot

    def write_corrections(self, parameters: Sequence[Parameter], out: np.ndarray) -> None:
        pass  # lr is the same at every step: frozen into the graph is right

    def reading_corrections(self, device: Any) -> AbstractContextManager[None]:
        return nullcontext()

    def state_dict(self, named: Named) -> dict[str, Any]:
        scaler = _scaler_meta(self)  # first: a captured step's scaler settles the counts
        return {"meta": {"kind": "sgd", "lr": self.lr, "steps": self.steps, **scaler},
                "tensors": {}}

    def load_state_dict(self, named: Named, state: dict[str, Any]) -> None:
        meta = state["meta"]
        if meta.get("kind") != "sgd":
            raise SmallemError(f"the checkpoint holds {meta.get('kind')!r} optimizer state, not "
                               "sgd: resume with the optimizer it was trained with")
        self.steps = int(meta["steps"])
        _load_scaler(self, meta)


class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2017).

    m and v are running means of g and g²; the step is m̂/(√v̂ + ε), with m̂, v̂ corrected for
    starting at zero. Each parameter counts its own steps t (as PyTorch does), so its first
    step moves it by exactly lr whenever it first receives a gradient. Decay pulls only
    parameters marked `decay` (matrices) toward zero: p ← p − lr·(m̂/(√v̂ + ε) + wd·p)."""

    def __init__(self, lr: float = ADAMW_LR, betas: tuple[float, float] = ADAMW_BETAS,
                 eps: float = ADAMW_EPS, weight_decay: float = ADAMW_WEIGHT_DECAY,
                 max_norm: float | None = None) -> None:
        self.lr = float(require("the learning rate", lr, "positive"))
        self.max_norm = require("the clipping norm", max_norm, "positive", optional=True)
        self.last_norm: float | None = None  # the global gradient norm before clipping
        self.beta1, self.beta2 = (float(b) for b in betas)
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise SmallemError(f"AdamW betas must lie in [0, 1), got {betas}")
        self.eps = float(require("AdamW's epsilon", eps, "positive"))
        self.weight_decay = float(require("the weight decay", weight_decay, "non-negative"))
        self.steps = 0  # updates made
        self.t: dict[Parameter, int] = {}  # each parameter's own t, for its 1 − βᵗ
        # While a GPU step is being captured: the device array the update reads the bias
        # corrections from when it runs, rewritten before every replay (reading_corrections).
        self._device_corrections: Any = None
        # Per-parameter moments, created at the first step, keyed by the Parameter itself:
        # a fused multi-tensor update can read them all from here.
        self.m: dict[Parameter, Tensor] = {}
        self.v: dict[Parameter, Tensor] = {}
        self.loss_scaler: Any = None  # fp16's LossScaler, saved with this state (make_step)
        self.loss_scaler_state: dict[str, Any] | None = None  # loaded, for a scaler not yet attached

    def step(self, parameters: Sequence[Parameter], gradients: Gradients) -> None:
        pairs, self.last_norm = _clip(with_gradients(parameters, gradients), self.max_norm)
        for p, _ in pairs:
            if p not in self.m:
                self.m[p] = p.backend.zeros(p.shape)
                self.v[p] = p.backend.zeros(p.shape)
        self.count_step([p for p, _ in pairs])
        # One call per backend for all parameters: the GPU backend updates them in one launch.
        for backend, group in _by_backend(pairs):
            ps = [p for p, _ in group]
            extra = ({} if self._device_corrections is None
                     else {"corrections": self._device_corrections})
            backend.adamw_update([p.value for p in ps], [g for _, g in group],
                                 [self.m[p] for p in ps], [self.v[p] for p in ps],
                                 steps=[self.t[p] for p in ps], lr=self.lr, beta1=self.beta1,
                                 beta2=self.beta2, eps=self.eps,
                                 weight_decays=[self.weight_decay if p.decay else 0.0
                                                for p in ps], **extra)

    def bias_corrections(self, parameters: Sequence[Parameter]) -> np.ndarray:
        """1 − β1ᵗ and 1 − β2ᵗ of each parameter, side by side, computed in float64 as every
        update does, then stored as float32: what a captured update reads on the device."""
        t = np.array([self.t.get(p, 0) for p in parameters], dtype=np.float64)
        return np.stack([1.0 - self.beta1 ** t, 1.0 - self.beta2 ** t], 1).astype(np.float32)

    # what a captured step needs (training.step.CapturableOptimizer): each step's 1 − βᵗ
    corrections_per_parameter = 2

    def snapshot(self) -> tuple[int, dict[Parameter, int]]:
        """The host counters (steps, each parameter's t), to restore after a failed capture."""
        return self.steps, dict(self.t)

    def restore(self, snapshot: tuple[int, dict[Parameter, int]]) -> None:
        self.steps, self.t = snapshot[0], dict(snapshot[1])

    def write_corrections(self, parameters: Sequence[Parameter], out: np.ndarray) -> None:
        """This step's bias corrections into `out` (2 floats per parameter, float32), the host
        side of the graph's input buffer, before the replay."""
        out[:] = self.bias_corrections(parameters).reshape(-1)

    @contextmanager
    def reading_corrections(self, device: Any) -> Iterator[None]:
        """Inside: every update reads its bias corrections from `device` (a device array of
        2 floats per parameter, in `parameters` order) when it runs, not from arguments."""
        self._device_corrections = device
        try:
            yield
        finally:
            self._device_corrections = None

    def count_step(self, parameters: Sequence[Parameter]) -> None:
        """The host's account of one update of `parameters`: each one's t advances."""
        self.steps += 1
        for p in parameters:
            self.t[p] = self.t.get(p, 0) + 1

    def state_dict(self, named: Named) -> dict[str, Any]:
        """Hyperparameters and step counts (JSON-able: "t" holds each parameter's own) and the
        moments as host arrays, named "<parameter>.m" and "<parameter>.v"."""
        scaler = _scaler_meta(self)  # first: a captured step's scaler settles the counts
        tensors, t = {}, {}
        for name, p in named:
            if p in self.m:
                tensors[f"{name}.m"] = np.array(p.backend.to_numpy(self.m[p]))  # copies
                tensors[f"{name}.v"] = np.array(p.backend.to_numpy(self.v[p]))
                t[name] = self.t[p]
        meta = {"kind": "adamw", "lr": self.lr, "betas": [self.beta1, self.beta2],
                "eps": self.eps, "weight_decay": self.weight_decay, "steps": self.steps, "t": t,
                **scaler}
        return {"meta": meta, "tensors": tensors}

    def load_state_dict(self, named: Named, state: dict[str, Any]) -> None:
        meta, tensors = state["meta"], state["tensors"]
        if meta.get("kind") != "adamw":
            raise SmallemError(f"the checkpoint holds {meta.get('kind')!r} optimizer state, not "
                               "adamw: resume with the optimizer it was trained with")
        _check_names("AdamW", named, tensors, ("m", "v"))
        self.steps = int(meta["steps"])
        _load_scaler(self, meta)
        t = meta.get("t", {})  # absent in checkpoints of smallem 0.1: every t was `steps`
        self.m, self.v, self.t = {}, {}, {}
        for name, p in named:
            if f"{name}.m" in tensors and f"{name}.v" in tensors:
                self.m[p] = p.backend.tensor(np.array(tensors[f"{name}.m"]))  # own copies
                self.v[p] = p.backend.tensor(np.array(tensors[f"{name}.v"]))
                self.t[p] = int(t.get(name, self.steps))
            elif self.steps:
                raise SmallemError(f"AdamW state has no moments for {name!r}: the checkpoint "
                                   "was made for another model")


OPTIMIZERS = ("adamw", "sgd")


def make_optimizer(name: str, lr: float | None = None, weight_decay: float | None = None,
                   max_norm: float | None = None) -> Optimizer:
    """"adamw" or "sgd" at learning rate `lr` (a model's measured one is in training/registry.py;
    left out, AdamW's own default: SGD has none), gradients clipped to a global norm of
    `max_norm` when it is given."""
    if name not in OPTIMIZERS:
        raise SmallemError(f"unknown optimizer {name!r}: choose one of {', '.join(OPTIMIZERS)}")
    if name == "adamw":
        kwargs = {} if weight_decay is None else {"weight_decay": weight_decay}
        return AdamW(ADAMW_LR if lr is None else lr, max_norm=max_norm, **kwargs)
    if lr is None:
        raise SmallemError("SGD has no default learning rate: pass one (each model's measured "
                           "rates are in smallem.training.registry)")
    return SGD(lr, max_norm=max_norm)

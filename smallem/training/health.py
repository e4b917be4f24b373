"""Training health: what a practitioner looks at to know a network is learning well.

Sits in training, above the tape and the optimizers; `smallem train --health`, the figures and
the notebooks' dashboard (course/common/dashboard.py) use it, and it imports no view. A
`HealthMonitor` is the observer of `train_step` / `train` (it owns no loop): every `every` steps it reads, on
that step's own tape, each activation layer (tanh, sigmoid, relu nodes: histogram, saturated
and dead units) and each parameter (gradient norm, and after the update the update-to-data
ratio log10(‖Δp‖/‖p‖)). Other steps cost nothing, and the device is read on sampled steps only.
`dead_units` is the one dead-unit rule (blocked on every input): the monitor and notebook 08 use it.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..autodiff.tape import Gradients, Tape, Var
from ..backends import Backend, Tensor, get_backend
from ..errors import SmallemError
from ..optim import global_norm
from ..training.config import HEALTH_EVERY

SATURATION = 0.97  # a tanh unit with |t| > 0.97 passes at most 1 − 0.97² ≈ 6 % of its gradient
BINS = 40  # histogram bins of each activation layer
REFERENCE_RATIO = -3.0  # log10(‖Δp‖/‖p‖) ≈ −3: the usual rule of thumb for a healthy pace

# Activation primitives the monitor reads, with the range their histogram spans (None: from
# the data). "Saturated" means: this unit passes (almost) no gradient on this example.
ACTIVATIONS: dict[str, tuple[float, float] | None] = {
    "tanh": (-1.0, 1.0), "sigmoid": (0.0, 1.0), "relu": None}


def blocked(op: str, values: np.ndarray, threshold: float = SATURATION) -> np.ndarray:
    """Where an activation passes (almost) no gradient: |tanh| > threshold, a sigmoid within
    1 − threshold of 0 or 1, a ReLU at zero."""
    if op == "tanh":
        return np.abs(values) > threshold
    if op == "sigmoid":
        return (values > threshold) | (values < 1.0 - threshold)
    if op == "relu":
        return values <= 0.0
    raise SmallemError(f"no saturation rule for {op!r}: choose one of {', '.join(ACTIVATIONS)}")


def dead_units(backend: Backend | str, activations: Sequence[Tensor | Var], op: str = "relu", *,
               threshold: float = SATURATION) -> list[np.ndarray]:
    """For each layer's activations [..., H] over a whole data set, a boolean mask [H] of the
    units blocked (see `blocked`) on every input: no input sends them a gradient, ever."""
    be = get_backend(backend)
    masks = []
    for k, a in enumerate(activations):
        a = a.value if isinstance(a, Var) else a
        shape = be.shape(a)
        if len(shape) < 2:
            raise SmallemError(f"dead_units: layer {k} has shape {list(shape)}; pass the "
                               "activations of a data set, [inputs, units] (or [..., units])")
        rows = np.asarray(be.to_numpy(a)).reshape(-1, shape[-1])  # every input and position
        masks.append(blocked(op, rows, threshold).all(axis=0))
    return masks


def dead_fraction(backend: Backend | str, activations: Sequence[Tensor | Var], op: str = "relu"
                  ) -> list[float]:
    """The fraction of dead units per layer (see `dead_units`), one float per layer."""
    return [float(mask.mean()) for mask in dead_units(backend, activations, op)]


def activation_stats(op: str, values: Any, *, bins: int = BINS,
                     threshold: float = SATURATION) -> dict[str, Any]:
    """Statistics of one layer's activations [..., H] (a host array): the fraction of
    (example, unit) pairs that are saturated, the fraction of units saturated on every example
    (dead: no example sends them a gradient), mean, std and a histogram."""
    a = np.asarray(values, dtype=np.float64)
    rows = a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(-1, 1)  # (examples, units)
    saturated = blocked(op, rows, threshold).mean()
    dead = dead_units("cpu64", [rows], op, threshold=threshold)[0]  # a host array is a cpu64 tensor
    span = ACTIVATIONS[op] or (0.0, max(float(rows.max()), 1e-12))
    counts, edges = np.histogram(rows, bins=bins, range=span)
    return {"op": op, "shape": list(a.shape), "saturated": float(saturated),
            "dead": float(dead.mean()), "mean": float(rows.mean()),
            "std": float(rows.std()), "counts": counts.tolist(), "edges": edges.tolist()}


def update_ratio(update_norm: float, value_norm: float) -> float | None:
    """log10(‖Δp‖/‖p‖), or None when nothing moved (or p is zero): no finite logarithm."""
    if update_norm > 0 and value_norm > 0:
        return math.log10(update_norm / value_norm)
    return None


class HealthMonitor:
    """The training-health observer: pass it to `train(config, observer=...)` or
    `train_step(..., observer=...)`.

    `model` names the parameters: the model being trained, one built the same way, or a
    mapping {name: Parameter}. Parameters are found on the tape as the leaves that receive a
    gradient, and named by matching shapes in the order the model lists them (the very
    parameter first, when `model` is the trained one). Without `model`: `leaf %k`.
    `sink` (a path or an open text file) receives every record as one JSON line, flushed.
    `listeners` are called with each health record (the live dashboard is one)."""

    def __init__(self, every: int = HEALTH_EVERY, model: Any = None, *, sink: str | Path | IO | None = None,
                 bins: int = BINS, threshold: float = SATURATION,
                 listeners: Iterable[Callable[[dict[str, Any]], Any]] = ()) -> None:
        if not isinstance(every, int) or every < 1:
            raise SmallemError(f"every must be a whole number of at least 1, got {every!r}")
        self.every, self.bins, self.threshold = every, bins, threshold
        self.names = _parameter_list(model)
        self.records: list[dict[str, Any]] = []  # one per sampled step
        self.losses: list[dict[str, Any]] = []  # the loop's history records (on_record)
        self.listeners = list(listeners)
        self.seconds = 0.0  # time spent in this monitor's hooks: its whole cost
        self._sink, self._owned = _open_sink(sink)
        self._step: int | None = None
        self._pending: dict[str, Any] | None = None
        self._steps_seen: deque[tuple[int, float]] = deque(maxlen=2)

    # the observer protocol -------------------------------------------------------------------
    def wants(self, step: int) -> bool:
        """Sample step 1 (the network as initialised) and every `every`-th step."""
        self._steps_seen.append((step, time.perf_counter()))
        if step == 1 or step % self.every == 0:
            self._step = step
            return True
        return False

    def after_backward(self, tape: Tape, loss_var: Var, grads: Gradients) -> None:
        start = time.perf_counter()
        be = tape.backend
        step = self._step if self._step is not None else len(self.records) + 1
        self._step = None
        leaves = self._name_leaves(tape, grads)
        layers = {}
        for label, node in _activation_nodes(tape, leaves):
            layers[label] = activation_stats(node.name, be.to_numpy(node.value), bins=self.bins,
                                             threshold=self.threshold)
        params = {}
        for name, index in leaves.items():
            value = tape.nodes[index].value  # the parameter's own tensor: updated in place
            params[name] = {"shape": list(tape.nodes[index].shape), "norm": global_norm(be, [value]),
                            "grad_norm": global_norm(be, [grads.node(index)])}
        # A copy of the values (on the device): the update is the difference after the step.
        before = {name: (tape.nodes[i].value, be.add(tape.nodes[i].value, 0.0))
                  for name, i in leaves.items()}
        self._pending = {"record": {"kind": "health", "step": step,
                                    "loss": be.item(tape.value(loss_var)),
                                    "activations": layers, "parameters": params},
                         "backend": be, "before": before}
        self.seconds += time.perf_counter() - start

    def after_update(self) -> None:
        if self._pending is None:
            return
        start = time.perf_counter()
        pending, self._pending = self._pending, None
        be, record = pending["backend"], pending["record"]
        for name, (value, old) in pending["before"].items():
            stats = record["parameters"][name]
            stats["update_norm"] = global_norm(be, [be.sub(value, old)])
            stats["update_ratio"] = update_ratio(stats["update_norm"], stats["norm"])
        self.records.append(record)
        self._write(record)
        self.seconds += time.perf_counter() - start
        for listener in self.listeners:
            listener(record)

    def on_history(self, records: Sequence[Mapping[str, Any]]) -> None:
        """The history before the loop's first step: left out, so a health file holds what
        the run measured from its first step on, as it always has (the run's JSON has step 0)."""

    def on_record(self, record: Mapping[str, Any]) -> None:
        """A history record of the loop (step, train_loss, held_out_loss, seconds)."""
        entry = {"kind": "loss", **record}
        self.losses.append(entry)
        self._write(entry)

    def restart(self) -> None:
        """Forget the samples and losses seen (a sink keeps what was written to it)."""
        self.records.clear()
        self.losses.clear()
        self._steps_seen.clear()
        self._step, self._pending = None, None

    # reading ----------------------------------------------------------------------------------
    def rate(self) -> float | None:
        """Steps per second between the last two steps the loop announced (None before)."""
        if len(self._steps_seen) < 2:
            return None
        (s0, t0), (s1, t1) = self._steps_seen
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None

    def series(self, kind: str, key: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{layer or parameter: (steps, values)} of one statistic over training, e.g.
        series("parameters", "update_ratio"); a missing value (no update) is NaN."""
        return health_series(self.records, kind, key)

    def close(self) -> None:
        if self._owned and self._sink is not None and not isinstance(self._sink, Path):
            self._sink.close()
        self._sink = None

    # inside -----------------------------------------------------------------------------------
    def _write(self, entry: Mapping[str, Any]) -> None:
        if isinstance(self._sink, Path):  # opened at the first record: a run that fails before
            self._sink = open(self._sink, "w", encoding="utf-8")  # training leaves the file as it was
        if self._sink is not None:
            self._sink.write(json.dumps(entry, allow_nan=False, default=_jsonable) + "\n")
            self._sink.flush()  # a run killed later still leaves every record written so far

    def _name_leaves(self, tape: Tape, grads: Gradients) -> dict[str, int]:
        """{parameter name: leaf index} for the leaves of `tape` that received a gradient."""
        leaves = [k for k, node in enumerate(tape.nodes)
                  if node.op is None and node.requires_grad and grads.node(k) is not None]
        named: dict[str, int] = {}
        unused = list(self.names)
        for k in leaves:
            node = tape.nodes[k]
            same = [entry for entry in unused if entry[1] == node.shape]
            exact = [entry for entry in same if entry[2] is node.value]
            match = (exact or same or [None])[0]
            if match is None:
                named[f"leaf %{k}"] = k
            else:
                unused.remove(match)
                named[match[0]] = k
        return named


def _parameter_list(model: Any) -> list[tuple[str, tuple[int, ...], Any]]:
    """(name, shape, value) of each parameter of a Module or a {name: Parameter} mapping."""
    if model is None:
        return []
    pairs = model.items() if isinstance(model, Mapping) else model.named_parameters()
    return [(name, tuple(p.shape), p.value) for name, p in pairs]


def _activation_nodes(tape: Tape, leaves: Mapping[str, int]) -> list[tuple[str, Any]]:
    """(label, node) for each activation node of the tape, labelled by the module whose
    parameters feed it most directly: `tanh(hidden)` is tanh of hidden.weight/bias's output."""
    owner = {index: name.rsplit(".", 1)[0] for name, index in leaves.items()}
    out, used = [], set()
    for k, node in enumerate(tape.nodes):
        if not isinstance(node.op, str) or node.op not in ACTIVATIONS:
            continue
        module = _nearest_owner(tape, k, owner)
        label = f"{node.op}({module})" if module else f"{node.op} %{k}"
        while label in used:  # the same layer applied twice: tell them apart by node
            label = f"{label} %{k}"
        used.add(label)
        out.append((label, node))
    return out


def _nearest_owner(tape: Tape, start: int, owner: Mapping[int, str], depth: int = 4) -> str | None:
    """Walk the inputs of node `start` breadth first: the first parameter leaf names it."""
    frontier = list(tape.nodes[start].inputs)
    for _ in range(depth):
        for k in frontier:
            if k in owner:
                return owner[k]
        frontier = [j for k in frontier for j in tape.nodes[k].inputs]
    return None


def _open_sink(sink: str | Path | IO | None) -> tuple[IO | Path | None, bool]:
    """The sink checked now, a path opened by the first record (_write)."""
    if sink is None or hasattr(sink, "write"):
        return sink, False  # type: ignore[return-value]
    path = Path(sink).expanduser()
    if path.is_dir():
        raise SmallemError(f"--health {str(sink)!r} is a folder: name a file in it")
    if not path.resolve().parent.is_dir():
        raise SmallemError(f"--health {sink}: folder {str(path.parent)!r} does not exist; "
                           "create it first")
    return path, True


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def health_series(records: Sequence[Mapping[str, Any]], kind: str, key: str
                  ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{name: (steps, values)} of `key` for every layer (kind "activations") or parameter
    (kind "parameters") over the records; None becomes NaN."""
    out: dict[str, tuple[list, list]] = {}
    for record in records:
        for name, stats in record[kind].items():
            steps, values = out.setdefault(name, ([], []))
            steps.append(record["step"])
            values.append(np.nan if stats.get(key) is None else stats[key])
    return {name: (np.array(s, dtype=np.float64), np.array(v, dtype=np.float64))
            for name, (s, v) in out.items()}


def load_health(path: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Read a `smallem train --health FILE` log: (health records, loss records). A last line
    cut short by a killed run is skipped."""
    health, losses = [], []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise SmallemError(f"cannot read health log {str(path)!r}: {error.strerror}") from None
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break  # the run was stopped while writing its last line
            raise SmallemError(f"{path}:{number} is not a JSON line of a health log") from None
        (health if entry.get("kind") == "health" else losses).append(entry)
    return health, losses


def divergence_advice(config: Any, model: Any) -> str:
    """What to change after a run diverged: under fp16, a weight past its largest number
    (65,504) becomes infinite in every product it enters, whatever the learning rate; else the
    learning rate, or clipping."""
    from ..backends.precision import get_format

    if config.precision == "fp16":
        largest = get_format("fp16").max
        sizes = [(float(np.nanmax(np.abs(p.numpy()), initial=0.0)), n) for n, p in model.named_parameters()]
        value, name = max(sizes)
        if value > largest:
            return (f"; the weight {name} reaches {value:,.0f}, past fp16's largest number "
                    f"{largest:,.0f}, where a product's inputs become infinite: train in bf16 "
                    "(fp32's range) or fp32, or keep the weights small (--weight-decay)")
    return (f"; lower --lr (it is {config.learning_rate:g})"
            + ("" if config.clip else " or clip the gradients with --clip 1"))

"""The capstone's pieces (notebook 13): the learner's answers of lessons 02-09 rebuilt from the
progress store, the tape they are planted in, the loss that runs every one of them, and each piece
checked alone on the model's own shapes (the rules against finite differences). capstone.py races
the engine they make against the package's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...autodiff.operations import cross_entropy
from ...autodiff.tape import Tape
from ...errors import SmallemError
from ...models.mlp import Mlp
from ..common.grading import EXERCISES
from ..common.progress import answers


@dataclass
class Piece:
    """One part of the engine: the exercise that wrote it, where it goes, and the function the
    engine runs (the learner's) or None (the package's stands in, for `reason`)."""

    id: str
    role: str  # where the engine uses it, in words
    fn: Callable | None = None
    reason: str = "left blank"

    @property
    def yours(self) -> bool:
        return self.fn is not None


# exercise id -> where the engine uses it. The rules are planted by op name (RULE_OF).
ROLES = {
    "02.exp_rule": "the rule of exp (the softmax written out)",
    "02.div_rule": "the rule of div (probabilities, and the mean of the two halves)",
    "03.sum_rule": "the rule of sum (the softmax's denominator, the target's probability)",
    "03.mean_rule": "the rule of mean (the written-out half's loss)",
    "09.dlogits": "the rule of cross_entropy (the fused half)",
    "09.linear_backward": "the rule of matmul (both layers: dx and dW)",
    "09.tanh_backward": "the rule of tanh (the hidden layer)",
    "09.embedding_backward": "the rule of gather_rows (the embedding)",
    "02.accumulate": "the tape's accumulate (every weight is read by both halves)",
    "03.unbroadcast": "the tape's unbroadcast (biases, the softmax's denominator)",
    "08.clip_by_global_norm": "clipping the gradients",
    "06.adamw_step": "the AdamW update of every parameter",
}
RULE_OF = {"02.exp_rule": "exp", "02.div_rule": "div", "03.sum_rule": "sum", "03.mean_rule": "mean",
           "09.dlogits": "cross_entropy", "09.linear_backward": "matmul", "09.tanh_backward": "tanh",
           "09.embedding_backward": "gather_rows"}
INPUT_NAMES = {"exp": ["a"], "div": ["a", "b"], "sum": ["a"], "mean": ["a"], "tanh": ["a"],
               "cross_entropy": ["logits"], "matmul": ["x", "W"], "gather_rows": ["the table"]}


def rebuild(exercise_id: str, source: str) -> Any:
    """The learner's answer of `exercise_id`, executed from its stored source (a cell defining
    it, or one lambda expression: a function written inline in `check(...)`)."""
    ex = EXERCISES[exercise_id]
    namespace: dict[str, Any] = {"np": np, "math": math, **ex.env}
    given = set(namespace)
    try:
        exec(compile(source, f"<your {exercise_id}>", "exec"), namespace)  # noqa: S102
    except NameError as error:
        if getattr(error, "name", None) in ("check", "use"):  # kept by an older smallem as the whole line
            raise SmallemError(f"it was written inside {error.name}(...), whose line cannot be run again "
                               "here: write it with def in its exercise cell and check it again") from None
        raise
    defined = [v for k, v in namespace.items() if k not in given and callable(v)]  # in source order
    if isinstance(ex.answer, tuple):  # a pair (11.split_heads): by its names, else as defined
        if all(callable(namespace.get(n)) for n in ex.answer):
            return tuple(namespace[n] for n in ex.answer)
        if len(defined) == len(ex.answer):
            return tuple(defined)
        raise SmallemError(f"its source defines no functions {', '.join(ex.answer)}")
    fn = namespace.get(ex.answer if isinstance(ex.answer, str) else "")
    if not callable(fn) and len(defined) == 1:  # the learner gave it another name
        fn = defined[0]
    if not callable(fn) and source.lstrip().startswith("lambda"):
        fn = eval(compile(source, f"<your {exercise_id}>", "eval"), namespace)  # noqa: S307
    if not callable(fn):
        raise SmallemError(f"its source defines no function {ex.answer!r}")
    return fn


def your_pieces(sources: dict[str, str] | None = None, roles: dict[str, str] | None = None) -> list[Piece]:
    """The pieces of `roles` (the 12 of ROLES by default), from `sources` (exercise id -> source
    text; by default every passing answer in the progress store). One that cannot be rebuilt is
    the package's, and says why."""
    sources = answers() if sources is None else sources
    pieces = []
    for eid, role in (ROLES if roles is None else roles).items():
        if eid not in sources:
            pieces.append(Piece(eid, role))
            continue
        try:
            pieces.append(Piece(eid, role, rebuild(eid, sources[eid]), ""))
        except SmallemError as error:
            pieces.append(Piece(eid, role, None, f"could not be rebuilt: {error}"))
        except Exception as error:  # noqa: BLE001  (a stored answer that no longer runs)
            pieces.append(Piece(eid, role, None, f"could not be rebuilt ({type(error).__name__}: "
                                                  f"{str(error)[:100]})"))
    return pieces


class PieceFailed(SmallemError):
    """A learner's piece raised during the race."""


def guard(piece: Piece) -> Callable:
    def run(*args: Any) -> Any:
        try:
            with np.errstate(all="ignore"):
                return piece.fn(*args)
        except Exception as error:  # noqa: BLE001
            raise PieceFailed(f"your {piece.id} raised {type(error).__name__} ({str(error)[:120]}) "
                              f"as {piece.role}") from None
    return run


def _shown(value: Any) -> str:
    """What a piece returned, in a few words: None, 0.0 (a float), a tuple of 3, an array [32, 128]."""
    if value is None or isinstance(value, (bool, int, float)):
        return f"{value!r}" + ("" if value is None else f" (a {type(value).__name__})")
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    shape = np.shape(value) if isinstance(value, np.ndarray) else None
    return f"an array of shape {list(shape)}" if shape is not None else f"a {type(value).__name__}"


class PieceDamaged(PieceFailed):
    """A learner's piece returned something of the wrong kind (None, a number for a tuple): it
    cannot be one of the engine's parts, so the package's stands in."""


def returned(piece: Piece, value: Any, wanted: str, count: int | None = None) -> Any:
    """`value` when it is what the engine needs (`count` gradients in a tuple or list, or one
    array of numbers), else PieceDamaged saying what came back; a float32 one fails by name."""
    low = [a.dtype for a in (value if isinstance(value, (tuple, list)) else [value])
           if getattr(a, "dtype", None) in (np.float32, np.float16)]
    if low:  # its rounding (1e-7) is far above the AGREE the race holds both engines to
        raise PieceFailed(f"your {piece.id} returned {low[0]} where the engine computes in float64 (keep "
                          f"the arrays as they come: the race holds it to 1e-9), as {piece.role}")
    if count is not None and isinstance(value, (tuple, list)) and len(value) >= count:
        return value
    if count is None and value is not None and not isinstance(value, (str, bytes, dict, tuple, list)):
        try:
            return np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            pass
    raise PieceDamaged(f"your {piece.id} returned {_shown(value)} where {wanted} is needed, as {piece.role}")


def as_rule(piece: Piece) -> Callable:
    """The learner's answer as a tape rule `(be, grad, out, *inputs, *args) -> (d_input, ...)`."""
    fn, op = guard(piece), RULE_OF[piece.id]
    one = "one array (the gradient)"
    if op == "cross_entropy":
        return lambda be, grad, out, logits, o: (returned(piece, fn(logits, o.targets_host), one) * grad,)
    if op == "matmul":
        return lambda be, grad, out, a, b: tuple(returned(piece, fn(a, b, grad), "a tuple (dx, dW)", 2)[:2])
    if op == "tanh":
        return lambda be, grad, out, a: (returned(piece, fn(out, grad), one),)
    if op == "gather_rows":
        return lambda be, grad, out, table, rows: (returned(piece, fn(rows, grad, table.shape[0]), one),)
    inputs = len(INPUT_NAMES[op])  # the lessons' rules already have the tape's signature
    return lambda be, grad, out, *args: returned(
        piece, fn(be, grad, out, *args), f"a tuple of {inputs} gradient{'s' if inputs > 1 else ''}, one per "
        "input", inputs)


class YourTape(Tape):
    """A tape whose accumulate and unbroadcast are the learner's (the package's when None)."""

    def __init__(self, backend: Any, *, rules: dict, accumulate: Callable | None,
                 unbroadcast: Callable | None) -> None:
        super().__init__(backend, rules=rules)
        self._accumulate, self._unbroadcast = accumulate, unbroadcast

    def accumulate(self, grads: list, index: int, grad: Any) -> None:
        if self._accumulate is None:
            return super().accumulate(grads, index, grad)
        self._accumulate(grads, index, grad)
        if grads[index] is None:
            raise PieceFailed("your 02.accumulate left grads[index] None after a contribution")

    def unbroadcast(self, grad: Any, shape: tuple[int, ...]) -> Any:
        if self._unbroadcast is None:
            return super().unbroadcast(grad, shape)
        return np.asarray(self._unbroadcast(grad, shape))


def your_loss(tape: Tape, model: Mlp, contexts: np.ndarray, targets: np.ndarray) -> Any:
    """The same mean cross-entropy as `model.loss`, by two roads: the batch's first half through
    the fused cross_entropy, the second through softmax written out of exp, sum, div, log, mean.
    Every weight is read by both halves, so its gradient is accumulated from two contributions."""
    half = len(contexts) // 2
    fused = cross_entropy(tape, model.logits(tape, contexts[:half]), targets[:half])
    z = model.logits(tape, contexts[half:])  # (B/2, V)
    e = tape.exp(z - z.value.max(axis=-1, keepdims=True))  # the row max, a constant, keeps exp finite
    p = e / tape.sum(e, -1, keepdim=True)  # (B/2, V) / (B/2, 1): unbroadcast in the backward
    onehot = np.eye(z.shape[-1])[targets[half:]]
    written = tape.mean(-tape.log(tape.sum(p * onehot, -1)))
    return (fused + written) / 2.0  # two means of equal halves: the batch's mean

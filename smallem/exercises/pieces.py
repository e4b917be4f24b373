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

from ..autodiff.operations import cross_entropy
from ..autodiff.tape import Tape
from ..autodiff.tape import unbroadcast as package_unbroadcast
from ..backends import get_backend
from ..errors import SmallemError
from ..models.mlp import Mlp
from ..optim import ADAMW_BETAS, ADAMW_EPS
from ..optim import clip_by_global_norm as package_clip
from .grading import EXERCISES
from .progress import answers


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


# -- finding the wrong piece: each one alone, on the model's own shapes ------------------------
INPUT_NAMES = {"exp": ["a"], "div": ["a", "b"], "sum": ["a"], "mean": ["a"], "tanh": ["a"],
               "cross_entropy": ["logits"], "matmul": ["x", "W"], "gather_rows": ["the table"]}
TOLERANCE = 1e-6  # finite differences along one direction, in float64: ~1e-10 when right


@dataclass
class Finding:
    """A piece checked alone: `ok`, `runs` (False when it raised or gave a wrong shape), and the
    sentence that says where it is wrong."""

    piece: Piece
    ok: bool
    runs: bool = True
    sentence: str = ""
    damaged: bool = False  # it returned the wrong kind of thing, or nan: the package's stands in


def _shapes(arrays: list) -> str:
    return ", ".join(str(list(np.shape(a))) for a in arrays)


def _check_rule(piece: Piece, node: Any, nodes: list, rng: np.random.Generator) -> Finding:
    op, be = RULE_OF[piece.id], get_backend("cpu64")
    inputs = [np.array(nodes[j].value) for j in node.inputs]
    where = f"on the model's own shapes ({op} of {_shapes(inputs)})"

    def forward(values: list) -> np.ndarray:
        tape = Tape(be)
        vs = [tape.constant(v) for v in values]
        out = tape.apply(node.args[0], vs) if op == "cross_entropy" else getattr(tape, op)(*vs, *node.args)
        return np.asarray(out.value)

    w = rng.normal(size=np.shape(node.value))  # a random incoming gradient: no element can hide
    try:
        got = as_rule(piece)(be, w, np.array(node.value), *inputs, *node.args)
    except PieceFailed as failed:
        return Finding(piece, False, False, f"{failed} {where}.", isinstance(failed, PieceDamaged))
    for k, (x, name) in enumerate(zip(inputs, INPUT_NAMES[op])):
        if not nodes[node.inputs[k]].requires_grad:
            continue
        g = np.asarray(package_unbroadcast(be, np.asarray(got[k], dtype=np.float64), x.shape)) \
            if len(got) > k and got[k] is not None else None
        if g is None or g.shape != x.shape:
            return Finding(piece, False, False, f"your {piece.id} gives {name} a gradient of shape "
                           f"{list(np.shape(got[k])) if g is not None else 'None'} where {name} has "
                           f"shape {list(x.shape)}, {where}.")
        if not np.all(np.isfinite(g)):
            return Finding(piece, False, False, f"your {piece.id} gives a gradient holding "
                           f"{'nan' if np.isnan(g).any() else 'inf'} for {name}, {where}.", damaged=True)
        v, eps = rng.normal(size=x.shape), 1e-6
        moved = lambda s: float(np.sum(w * forward([x + s * v if j == k else y  # noqa: E731
                                                     for j, y in enumerate(inputs)])))
        numeric, analytic = (moved(eps) - moved(-eps)) / (2 * eps), float(np.sum(g * v))
        error = abs(analytic - numeric) / max(abs(analytic), abs(numeric), 1e-6)
        if not error <= TOLERANCE:
            return Finding(piece, False, True, f"look at your {piece.id}, {piece.role}: {where}, "
                           f"along a random direction its gradient for {name} gives {analytic:.6g} "
                           f"where finite differences give {numeric:.6g}.")
    return Finding(piece, True)


def _check_accumulate(piece: Piece, shape: tuple, rng: np.random.Generator) -> Finding:
    fn, (c1, c2) = guard(piece), rng.normal(size=(2, *shape))
    try:
        grads = [None, None]
        fn(grads, 0, c1.copy())  # copies: a += must not change the sum it is checked against
        fn(grads, 0, c2.copy())
        if grads[0] is None or not np.allclose(grads[0], c1 + c2, rtol=1e-12, atol=0):
            return Finding(piece, False, True, f"look at your 02.accumulate: two contributions to "
                           f"a weight of shape {list(shape)} do not add up to their sum.")
        shared, grads = c1.copy(), [None, None]
        for index, g in [(0, shared), (1, shared), (0, c2)]:
            fn(grads, index, g)
        if not np.array_equal(grads[1], c1):
            return Finding(piece, False, True, "look at your 02.accumulate: adding into one node "
                           "changed another that held the same array (+= where a new array is needed).")
    except PieceFailed as failed:
        return Finding(piece, False, False, f"{failed}.")
    return Finding(piece, True)


def _check_unbroadcast(piece: Piece, pairs: list, rng: np.random.Generator) -> Finding:
    be, fn = get_backend("cpu64"), guard(piece)
    for grad_shape, shape in pairs:
        grad = rng.normal(size=grad_shape)
        try:
            got = returned(piece, fn(grad.copy(), shape), "one array (the gradient, summed to the shape)")
        except PieceFailed as failed:
            return Finding(piece, False, False, f"{failed}.", isinstance(failed, PieceDamaged))
        want = package_unbroadcast(be, grad, shape)
        if got.ndim == 0 and want.ndim:
            return Finding(piece, False, False, f"your 03.unbroadcast returned one number where an array "
                           f"of shape {list(want.shape)} is needed, as {piece.role}.", damaged=True)
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-12, atol=1e-15):
            return Finding(piece, False, got.shape == want.shape,
                           f"look at your 03.unbroadcast: a gradient {list(grad_shape)} for an input "
                           f"{list(shape)} (the model's own) becomes {list(got.shape)} "
                           f"{'with other values than ' if got.shape == want.shape else 'instead of '}"
                           f"the package's {list(want.shape)}.")
    return Finding(piece, True)


def _check_clip(piece: Piece, grads: list, max_norm: float) -> Finding:
    fn = guard(piece)
    norm = package_clip("cpu64", grads, max_norm)[1]
    for limit in (norm / 2, 2 * norm):  # the model's gradients clipped, then left alone
        want, _ = package_clip("cpu64", grads, limit)
        try:
            got = returned(piece, fn([g.copy() for g in grads], limit), "a list of gradients, one per "
                           "parameter", len(grads))
        except PieceFailed as failed:
            return Finding(piece, False, False, f"{failed}.", isinstance(failed, PieceDamaged))
        if len(got) != len(grads) or any(np.shape(a) != np.shape(b) for a, b in zip(got, want)):
            return Finding(piece, False, False, "your 08.clip_by_global_norm does not return one "
                           "gradient of the same shape per parameter.")
        if not all(np.allclose(a, b, rtol=1e-12, atol=0) for a, b in zip(got, want)):
            return Finding(piece, False, True, f"look at your 08.clip_by_global_norm: the model's "
                           f"gradients (global norm {norm:.3g}, max_norm {limit:.3g}) are clipped "
                           "differently from the package's.")
    return Finding(piece, True)


def _check_adamw(piece: Piece, params: list, grads: list, settings: dict) -> Finding:
    be, fn = get_backend("cpu64"), guard(piece)
    for param, g in zip(params, grads):
        wd = settings["weight_decay"] if param.decay else 0.0
        p, m, v = param.numpy(), np.zeros(param.shape), np.zeros(param.shape)
        ref = [p.copy(), m.copy(), v.copy()]
        for t, gt in [(1, g), (2, 0.5 * g + 0.1 * np.abs(g).mean())]:
            be.adamw_update(*[[a] for a in (ref[0], gt, ref[1], ref[2])], steps=[t], lr=settings["lr"],
                            beta1=ADAMW_BETAS[0], beta2=ADAMW_BETAS[1], eps=ADAMW_EPS, weight_decays=[wd])
            try:
                out = returned(piece, fn(p, gt, m, v, t, settings["lr"], *ADAMW_BETAS, ADAMW_EPS, wd),
                               "a tuple (p, m, v)", 3)
                p, m, v = (returned(piece, a, "arrays of numbers (p, m, v)") for a in out[:3])
            except PieceFailed as failed:
                return Finding(piece, False, False, f"{failed}.", isinstance(failed, PieceDamaged))
            for name, mine, theirs in zip("pmv", (p, m, v), ref):
                if mine.shape != theirs.shape or not np.allclose(mine, theirs, rtol=1e-9, atol=1e-15):
                    return Finding(piece, False, mine.shape == theirs.shape,
                                   f"look at your 06.adamw_step: at step t = {t} of a parameter of "
                                   f"shape {list(param.shape)}, its {name} differs from the "
                                   "package's AdamW.")
    return Finding(piece, True)


def diagnose(pieces: list[Piece], model: Mlp, contexts: np.ndarray, targets: np.ndarray,
             settings: dict, seed: int = 0) -> list[Finding]:
    """Each of the learner's pieces alone, on the model's own shapes and gradients (one batch):
    the rules against finite differences, the rest against the package's."""
    rng = np.random.default_rng(seed)
    tape = Tape("cpu64")
    grads = tape.backward(your_loss(tape, model, contexts, targets))
    params = model.parameters()
    g = [np.array(p.grad(grads)) for p in params]
    nodes, findings = tape.nodes, []
    for piece in pieces:
        if not piece.yours:
            continue
        if piece.id in RULE_OF:
            seen, found = set(), Finding(piece, True)
            for node in nodes:
                key = (node.op, tuple(nodes[j].shape for j in node.inputs))
                if node.op == RULE_OF[piece.id] and node.requires_grad and key not in seen:
                    seen.add(key)  # every shape it meets: one that cannot run outranks one that is off
                    checked = _check_rule(piece, node, nodes, rng)
                    if found.ok or (found.runs and not checked.runs):
                        found = checked
        elif piece.id == "02.accumulate":
            found = _check_accumulate(piece, params[1].shape, rng)
        elif piece.id == "03.unbroadcast":
            half, c = len(contexts) // 2, model.config
            found = _check_unbroadcast(piece, [((half, c.hidden), (c.hidden,)), ((half, c.vocab), (c.vocab,)),
                                               ((half, c.vocab), (half, 1))], rng)
        elif piece.id == "08.clip_by_global_norm":
            found = _check_clip(piece, g, settings["max_norm"])
        else:
            found = _check_adamw(piece, params, g, settings)
        findings.append(found)
    return findings


def describe(pieces: list[Piece]) -> str:
    """One line per piece: whose it is, the exercise, and where the engine uses it."""
    return "\n".join(f"{'yours    ' if p.yours else 'package  '} {p.id:<24} {p.role}"
                     + ("" if p.yours else f"  [{p.reason}]") for p in pieces)

"""The capstone's diagnosis (notebook 13): each of the learner's pieces (pieces.py) checked alone
on the model's own shapes — the rules against finite differences, the accumulation, unbroadcast,
clipping and the AdamW step against the package's — so that a race that goes wrong names the
piece that is wrong, in one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...autodiff.tape import Tape
from ...autodiff.tape import unbroadcast as package_unbroadcast
from ...backends import get_backend
from ...models.mlp import Mlp
from ...optim import ADAMW_BETAS, ADAMW_EPS
from ...optim import clip_by_global_norm as package_clip
from .pieces import (
    INPUT_NAMES,
    RULE_OF,
    Piece,
    PieceDamaged,
    PieceFailed,
    as_rule,
    guard,
    returned,
    your_loss,
)

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

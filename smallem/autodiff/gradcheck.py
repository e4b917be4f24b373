"""Finite differences: checking every gradient rule without using any of them.

`check_gradients` compares the tape's gradients with central differences in float64,
(f(x + ε) − f(x − ε)) / 2ε, for every element of every input. The output is reduced with
random, all-different weights, so a rule that mixes two elements up cannot hide. CASES holds
one or more checks for every primitive and operation; the CLI, the tests and notebook 04 use it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends import Backend, get_backend
from ..errors import SmallemError
from .attention import Attention
from .checkpoint import checkpoint
from .operations import OPERATIONS, CrossEntropy, Huber, LayerNorm, Linear, LinearAdd, Softmax
from .primitives import PRIMITIVES, Rule
from .qkv_attention import QkvAttention
from .tape import Tape, Var

EPSILON = 1e-5
TOLERANCE = 1e-6
FLOAT32_TOLERANCE = 1e-4  # a float32 backend's gradients against float64's (compare_backends)


@dataclass
class GradcheckResult:
    name: str
    max_error: float  # max over elements of |analytic − numeric| / max(|a|, |n|, 1)
    elements: int  # how many input elements were perturbed
    tolerance: float = TOLERANCE
    analytic: list[np.ndarray] = field(default_factory=list, repr=False)
    numeric: list[np.ndarray] = field(default_factory=list, repr=False)
    error: str | None = None  # the sentence of a rule that could not even run (a bad shape)

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.max_error <= self.tolerance)


def output_weights(shape: tuple[int, ...], seed: int = 1234) -> np.ndarray:
    """Random weights, all different, that turn an output into a scalar."""
    return np.random.default_rng(seed).uniform(0.5, 1.5, size=shape) * \
        np.random.default_rng(seed + 1).choice([-1.0, 1.0], size=shape)


def tape_gradients(fn: Callable[..., Var], inputs: Sequence[np.ndarray], *,
                   backend: str | Backend = "cpu64", weights: np.ndarray | None = None,
                   rules: dict[str, Rule] | None = None, fused: bool = True,
                   tape_class: type = Tape) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """The tape's side of a check: the output of `fn(tape, *leaves)`, the gradient of
    Σ weights·output for each input (float64, on the host), and the weights used. The weights
    enter as backward's starting gradient, not through the tape's own mul and sum: a wrong
    rule of those shows in their cases alone."""
    be = get_backend(backend)
    tape = tape_class(be, rules=rules, fused=fused)
    leaves = [tape.leaf(x) for x in inputs]
    out = fn(tape, *leaves)
    w = output_weights(out.shape) if weights is None else np.asarray(weights, np.float64)
    grads = tape.backward(out, grad=w)
    host = lambda x: np.asarray(be.to_numpy(x), np.float64)  # noqa: E731
    return host(out.value), [host(grads[v]) if grads.get(v) is not None else np.zeros(np.shape(x))
                             for v, x in zip(leaves, inputs)], w


def check_gradients(fn: Callable[..., Var], inputs: Sequence[np.ndarray], *, name: str = "",
                    backend: str = "cpu64", eps: float = EPSILON, tolerance: float = TOLERANCE,
                    weights: np.ndarray | None = None, rules: dict[str, Rule] | None = None,
                    fused: bool = True, tape_class: type = Tape) -> GradcheckResult:
    """Compare the tape's gradients of `fn(tape, *vars)` with central differences.

    `weights` reduces the output to a scalar (random and all different by default; pass ones
    to see what a plain sum misses). `rules` plants rules on the tapes of this check only;
    `tape_class` lets a lesson check a tape of its own. A rule that cannot run (a gradient of
    the wrong shape) is this check's failure, reported in `error`, not an exception."""
    be = get_backend(backend)
    inputs = [np.array(x, dtype=np.float64) for x in inputs]
    try:
        out, analytic, w = tape_gradients(fn, inputs, backend=be, weights=weights, rules=rules,
                                          fused=fused, tape_class=tape_class)
    except (SmallemError, ValueError, IndexError, TypeError) as error:
        return GradcheckResult(name, float("inf"), 0, tolerance, error=str(error))

    def scalar(values: Sequence[np.ndarray]) -> float:
        tape = tape_class(be, rules=rules, fused=fused)  # forward only: no rule runs
        out = fn(tape, *[tape.constant(v) for v in values])
        return float(np.sum(np.asarray(be.to_numpy(out.value), np.float64) * w))

    numeric, worst, count = [], 0.0, 0
    for k, x in enumerate(inputs):
        num = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            values = [v.copy() for v in inputs]
            values[k][i] = x[i] + eps
            up = scalar(values)
            values[k][i] = x[i] - eps
            down = scalar(values)
            num[i] = (up - down) / (2 * eps)
            a = analytic[k][i]
            err = abs(a - num[i]) / max(abs(a), abs(num[i]), 1.0)
            worst = max(worst, err if np.isfinite(err) else np.inf)  # a nan fails, never compares away
            count += 1
        numeric.append(num)
    return GradcheckResult(name, worst, count, tolerance, analytic, numeric)


# ------------------------------------------------------------------------------------------
# One or more cases for every primitive and operation.


@dataclass
class Case:
    name: str
    covers: str  # the primitive or operation this case checks
    fn: Callable[..., Var]
    inputs: Callable[[np.random.Generator], list[np.ndarray]]

    def run(self, backend: str = "cpu64", seed: int = 0, **kw: Any) -> GradcheckResult:
        return check_gradients(self.fn, self.inputs(np.random.default_rng(seed)),
                               name=self.name, backend=backend, **kw)


def _away(rng: np.random.Generator, shape, lo: float = 0.2, hi: float = 2.0) -> np.ndarray:
    """Random values with |x| in [lo, hi]: away from the kinks of relu, abs and clip."""
    return rng.uniform(lo, hi, size=shape) * rng.choice([-1.0, 1.0], size=shape)


def _n(*shape):
    return lambda rng: [rng.normal(size=shape)]


def _normals(*shapes):
    """One standard-normal input per shape, drawn in order."""
    return lambda rng: [rng.normal(size=s) for s in shapes]


CASES: list[Case] = []

_BROADCASTS = {"": ((4, 3), (4, 3)), "[4,3]+[3]": ((4, 3), (3,)), "[4,3]+[4,1]": ((4, 3), (4, 1)),
               "[2,4,3]+[3]": ((2, 4, 3), (3,)), "[4,3]+scalar": ((4, 3), ())}


def _binary_case(op: str, label: str, shape_a: tuple, shape_b: tuple) -> Case:
    """`op` on inputs of two shapes that broadcast; b stays away from 0 (div)."""
    return Case(f"{op} {label}" if label else f"{op} {list(shape_a)}", op,
                lambda t, a, b: getattr(t, op)(a, b),
                lambda rng: [rng.normal(size=shape_a), _away(rng, shape_b, 0.5, 2.0)])


CASES += [_binary_case(op, label, sa, sb) for op in ("add", "sub", "mul", "div")
          for label, (sa, sb) in _BROADCASTS.items()]

CASES += [
    Case("neg", "neg", lambda t, a: t.neg(a), _n(4, 3)),
    Case("matmul [4,3]@[3,5]", "matmul", lambda t, a, b: t.matmul(a, b), _normals((4, 3), (3, 5))),
    Case("matmul [2,4,3]@[3,5]", "matmul", lambda t, a, b: t.matmul(a, b), _normals((2, 4, 3), (3, 5))),
    Case("matmul [2,4,3]@[2,3,5]", "matmul", lambda t, a, b: t.matmul(a, b), _normals((2, 4, 3), (2, 3, 5))),
    Case("transpose [4,3]", "transpose", lambda t, a: t.transpose(a), _n(4, 3)),
    Case("transpose [2,4,3] 0,2", "transpose", lambda t, a: t.transpose(a, 0, 2), _n(2, 4, 3)),
    Case("reshape [2,4,3]->[8,3]", "reshape", lambda t, a: t.reshape(a, (8, 3)), _n(2, 4, 3)),
    Case("broadcast_to [3]->[4,3]", "broadcast_to", lambda t, a: t.broadcast_to(a, (4, 3)), _n(3)),
    Case("broadcast_to [4,1]->[2,4,3]", "broadcast_to", lambda t, a: t.broadcast_to(a, (2, 4, 3)), _n(4, 1)),
    Case("sum all", "sum", lambda t, a: t.sum(a), _n(4, 3)),
    Case("sum dim 0", "sum", lambda t, a: t.sum(a, 0), _n(4, 3)),
    Case("sum dim -1 keepdim", "sum", lambda t, a: t.sum(a, -1, keepdim=True), _n(2, 4, 3)),
    Case("mean all", "mean", lambda t, a: t.mean(a), _n(4, 3)),
    Case("mean dim 1", "mean", lambda t, a: t.mean(a, 1), _n(2, 4, 3)),
    Case("mean dim -1 keepdim", "mean", lambda t, a: t.mean(a, -1, keepdim=True), _n(4, 3)),
    Case("exp", "exp", lambda t, a: t.exp(a), _n(4, 3)),
    Case("log", "log", lambda t, a: t.log(a), lambda r: [r.uniform(0.5, 3.0, size=(4, 3))]),
    Case("tanh", "tanh", lambda t, a: t.tanh(a), _n(4, 3)),
    Case("sigmoid", "sigmoid", lambda t, a: t.sigmoid(a), lambda r: [3 * r.normal(size=(4, 3))]),
    Case("relu", "relu", lambda t, a: t.relu(a), lambda r: [_away(r, (4, 3))]),
    Case("square", "square", lambda t, a: t.square(a), _n(4, 3)),
    Case("power 3", "power", lambda t, a: t.power(a, 3), _n(4, 3)),
    Case("power -0.5", "power", lambda t, a: a ** -0.5, lambda r: [r.uniform(0.5, 3.0, size=(4, 3))]),
    Case("abs", "abs", lambda t, a: t.abs(a), lambda r: [_away(r, (4, 3))]),
    Case("clip [-1,1]", "clip", lambda t, a: t.clip(a, -1.0, 1.0),
         lambda r: [np.where(r.random((4, 3)) < 0.5, _away(r, (4, 3), 0.1, 0.9),
                             _away(r, (4, 3), 1.1, 3.0))]),
    Case("gather_rows, repeated rows", "gather_rows",
         lambda t, a: t.gather_rows(a, np.array([[2, 0, 2], [4, 2, 0]])), _n(5, 3)),
    Case("cross_entropy [6,5]", "cross_entropy",
         lambda t, a: t.apply(CrossEntropy(np.array([0, 4, 2, 2, 1, 3])), [a]), _n(6, 5)),
    Case("cross_entropy [2,3,5]", "cross_entropy",
         lambda t, a: t.apply(CrossEntropy(np.array([[0, 4, 2], [1, 1, 3]])), [a]),
         lambda r: [3 * r.normal(size=(2, 3, 5))]),
    Case("layer_norm [4,5]", "layer_norm", lambda t, x, w, b: t.apply(LayerNorm(), [x, w, b]),
         lambda r: [r.normal(size=(4, 5)), 1 + 0.3 * r.normal(size=5), r.normal(size=5)]),
    Case("layer_norm [2,3,5]", "layer_norm", lambda t, x, w, b: t.apply(LayerNorm(), [x, w, b]),
         lambda r: [2 * r.normal(size=(2, 3, 5)), r.normal(size=5), r.normal(size=5)]),
    Case("linear [4,3]@[3,5]+[5]", "linear", lambda t, x, w, b: t.apply(Linear(), [x, w, b]),
         _normals((4, 3), (3, 5), (5,))),
    Case("linear [2,4,3]@[3,5]+[5]", "linear", lambda t, x, w, b: t.apply(Linear(), [x, w, b]),
         _normals((2, 4, 3), (3, 5), (5,))),
    Case("linear_add [2,4,3]@[3,5]+[5]+[2,4,5]", "linear_add",
         lambda t, x, w, b, r: t.apply(LinearAdd(), [x, w, b, r]),
         _normals((2, 4, 3), (3, 5), (5,), (2, 4, 5))),
    Case("qkv_attention [2,3,4], 2 heads", "qkv_attention",
         lambda t, x, *ps: t.apply(QkvAttention(2), [x, *ps]),
         _normals((2, 3, 4), (4, 4), (4,), (4, 4), (4,), (4, 4), (4,))),
    Case("huber, both sides of delta", "huber", lambda t, p, y: t.apply(Huber(1.0), [p, y]),
         lambda r: [np.concatenate([_away(r, (6,), 0.05, 0.9), _away(r, (6,), 1.1, 4.0)]),
                    np.zeros(12)]),
]



# Attention, composed: one causal head, two heads through reshape/transpose/batched matmul, and
# a whole pre-LN block (the Transformer's, small enough for finite differences).
def _one_head(t: Tape, x: Var, wq: Var, wk: Var, wv: Var) -> Var:
    """x (T, C), w (C, D) -> softmax(q kᵀ/√D, causal) v, (T, D)."""
    q, k, v = x @ wq, x @ wk, x @ wv
    scores = t.div(q @ t.transpose(k), float(np.sqrt(wq.shape[1])))
    return t.apply(Softmax(causal=True), [scores]) @ v


def _heads(t: Tape, x: Var, wq: Var, wk: Var, wv: Var, wo: Var, heads: int = 2) -> Var:
    """x (B, T, C) -> causal multi-head attention (B, T, C), heads split by reshape+transpose."""
    b, n, c = x.shape
    split = lambda y: t.transpose(t.reshape(y, (b, n, heads, c // heads)), 1, 2)  # noqa: E731
    q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)  # (B, H, T, D)
    scores = t.div(q @ t.transpose(k, -2, -1), float(np.sqrt(c // heads)))  # (B, H, T, T)
    out = t.apply(Softmax(causal=True), [scores]) @ v  # (B, H, T, D)
    return t.reshape(t.transpose(out, 1, 2), (b, n, c)) @ wo  # (B, T, C)


def _block(t: Tape, x: Var, g1: Var, b1: Var, wq: Var, wk: Var, wv: Var, wo: Var, g2: Var,
           b2: Var, w1: Var, c1: Var, w2: Var, c2: Var) -> Var:
    """One pre-LN block: x + attention(LN(x)), then + MLP(LN(·)) with GELU."""
    x = x + _heads(t, t.apply(LayerNorm(), [x, g1, b1]), wq, wk, wv, wo)
    hidden = t.gelu(t.apply(LayerNorm(), [x, g2, b2]) @ w1 + c1)
    return x + (hidden @ w2 + c2)


def _block_inputs(r: np.random.Generator, c: int = 4) -> list[np.ndarray]:
    w = lambda *shape: 0.5 * r.normal(size=shape)  # noqa: E731
    return [r.normal(size=(2, 3, c)), 1 + 0.2 * r.normal(size=c), w(c), w(c, c), w(c, c),
            w(c, c), w(c, c), 1 + 0.2 * r.normal(size=c), w(c), w(c, 4 * c), w(4 * c),
            w(4 * c, c), w(c)]


CASES += [
    Case("matmul [2,2,3,4]@[2,2,4,3]", "matmul", lambda t, a, b: t.matmul(a, b),
         lambda r: [r.normal(size=(2, 2, 3, 4)), r.normal(size=(2, 2, 4, 3))]),
    Case("transpose [2,3,2,2] 1,2", "transpose", lambda t, a: t.transpose(a, 1, 2),
         _n(2, 3, 2, 2)),
    Case("gelu", "gelu", lambda t, a: t.gelu(a), lambda r: [2 * r.normal(size=(4, 3))]),
    Case("softmax [4,5]", "softmax", lambda t, a: t.apply(Softmax(), [a]), _n(4, 5)),
    Case("softmax [2,3,5], large logits", "softmax", lambda t, a: t.apply(Softmax(), [a]),
         lambda r: [4 * r.normal(size=(2, 3, 5)) + 50]),
    Case("softmax causal [4,4]", "softmax",
         lambda t, a: t.apply(Softmax(causal=True), [a]), _n(4, 4)),
    Case("softmax causal [2,2,3,3]", "softmax",
         lambda t, a: t.apply(Softmax(causal=True), [a]), _n(2, 2, 3, 3)),
    Case("softmax causal [1,1], one entry", "softmax",
         lambda t, a: t.apply(Softmax(causal=True), [a]), _n(1, 1)),
    Case("one causal head [4,3]→[4,2]", "softmax", _one_head,
         lambda r: [r.normal(size=(4, 3))] + [r.normal(size=(3, 2)) for _ in range(3)]),
    Case("two causal heads [2,3,4]", "softmax", _heads,
         lambda r: [r.normal(size=(2, 3, 4))] + [0.7 * r.normal(size=(4, 4)) for _ in range(4)]),
    Case("pre-LN block [2,3,4]", "layer_norm", _block, _block_inputs),
]



def _attention_case(causal: bool, shape_q: tuple, keys: int, tile: int,
                    backward_tile: Callable | None = None) -> Case:
    """Fused attention in tiles of `tile`: T not a multiple of it, one tile, many, a tile past T."""
    *lead, t, d = shape_q
    return Case(f"attention {'causal' if causal else 'full'} T={t} S={keys} tile={tile}",
                "attention", lambda tp, q, k, v: tp.apply(
                    Attention(causal, tile=tile, backward_tile=backward_tile), [q, k, v]),
                _normals(shape_q, (*lead, keys, d), (*lead, keys, d)))


def attention_cases(backward_tile: Callable | None = None) -> list[Case]:
    """The fused attention's checks, causal masks of every shape: `backward_tile` plants a
    lesson's tile rule in each (lesson 15 grades the learner's with these very cases)."""
    shapes = [(True, (1, 1, 1, 2), 1, 1), (True, (2, 3, 2), 3, 2), (True, (2, 2, 5, 3), 5, 2),
              (True, (1, 2, 7, 2), 7, 3), (True, (1, 1, 4, 3), 4, 8), (False, (2, 3, 2), 5, 2),
              (False, (1, 2, 4, 3), 4, 4)]
    return [_attention_case(*shape, backward_tile=backward_tile) for shape in shapes]


def _segment(t: Tape, x: Var, w: Var, b: Var) -> Var:
    """A small segment for checkpointing: tanh(x w + b) w, w used twice inside."""
    return t.tanh(x @ w + b) @ w


CASES += attention_cases() + [
          Case("checkpoint tanh(x w + b) w", "checkpoint",
               lambda t, x, w, b: checkpoint(t, _segment, x, w, b), _normals((3, 4), (4, 4), (4,))),
          Case("checkpoint of a pre-LN block [2,3,4]", "checkpoint",
               lambda t, *xs: checkpoint(t, _block, *xs), _block_inputs)]

COVERED = PRIMITIVES + tuple(OPERATIONS)


def run_all(backend: str = "cpu64", seed: int = 0) -> list[GradcheckResult]:
    """Every case, on `backend` (float64 for a meaningful tolerance of 1e-6)."""
    return [case.run(backend, seed) for case in CASES]


def compare_backends(backend: str = "gpu", reference: str = "cpu64", *,
                     tolerance: float = FLOAT32_TOLERANCE, seed: int = 0) -> list[GradcheckResult]:
    """Every case's tape gradients on `backend` against `reference`, same inputs and weights.
    Finite differences need float64; a float32 backend (the GPU) is checked this way instead:
    the rules are proven on cpu64, this proves the kernels apply them faithfully. The error is
    max |g − g_ref| / max(|g_ref|_max, 1) over every element of every input."""
    results = []
    for case in CASES:
        inputs = [np.array(x, np.float64) for x in case.inputs(np.random.default_rng(seed))]
        _, grads, _ = tape_gradients(case.fn, inputs, backend=backend)
        _, expected, _ = tape_gradients(case.fn, inputs, backend=reference)
        worst = max(float(np.max(np.abs(g - e), initial=0.0)) / max(1.0, float(np.max(np.abs(e))))
                    for g, e in zip(grads, expected))
        results.append(GradcheckResult(case.name, worst, sum(x.size for x in inputs), tolerance,
                                       grads, expected))
    return results


def format_table(results: Sequence[GradcheckResult]) -> str:
    width = max(len(r.name) for r in results)
    lines = [f"{'check':<{width}}  {'elements':>8}  {'max rel. error':>14}  result"]
    for r in results:
        lines.append(f"{r.name:<{width}}  {r.elements:>8}  {r.max_error:>14.2e}  "
                     f"{'PASS' if r.passed else 'FAIL'}" + (f"  ({r.error})" if r.error else ""))
    passed = sum(r.passed for r in results)
    lines.append(f"{passed} passed, {len(results) - passed} failed")
    return "\n".join(lines)

"""A stand-in for smallem.models.transformer, for a device run made before that model lands:
the same architecture as issue 20's (pre-LN blocks of causal multi-head attention and a GELU MLP,
learned positions, a final LayerNorm, a head to 257 logits), with its own Softmax operation and
a GELU operation when the package has none. `install()` puts it where bench.build looks.
Deleted once the real model is merged."""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass
from typing import Any

import numpy as np

from smallem.autodiff import operations as ops
from smallem.autodiff.operations import CrossEntropy, LayerNorm, Operation
from smallem.autodiff.primitives import RULES
from smallem.nn import Embedding, Linear, Module, Parameter


@dataclass
class TransformerConfig:
    layers: int = 2
    width: int = 128
    heads: int = 4
    context: int = 64
    vocab: int = 257


class Softmax(Operation):
    """softmax over the last dimension; causal: entries j > i of each (T, T) block are 0."""

    name = "softmax"

    def __init__(self, causal: bool = False) -> None:
        self.causal = causal

    def forward(self, be: Any, x: Any) -> Any:
        if self.causal:
            t = be.shape(x)[-1]
            x = be.add(x, be.tensor(np.where(np.tril(np.ones((t, t), bool)), 0.0, -np.inf)))
        e = be.exp(be.sub(x, be.max(x, -1, keepdim=True)))
        return be.div(e, be.sum(e, -1, keepdim=True))

    def backward(self, be: Any, grad: Any, out: Any, x: Any) -> tuple:
        """dx = s ⊙ (g − Σⱼ gⱼ sⱼ)"""
        return (be.mul(out, be.sub(grad, be.sum(be.mul(grad, out), -1, keepdim=True))),)


K, A = math.sqrt(2 / math.pi), 0.044715


class Gelu(Operation):
    name = "gelu"

    def forward(self, be: Any, x: Any) -> Any:
        if hasattr(type(be), "gelu"):
            out = be.gelu(x)
            if out is not None:
                return out
        inner = be.mul(be.add(x, be.mul(be.mul(be.square(x), x), A)), K)
        return be.mul(be.mul(x, 0.5), be.add(be.tanh(inner), 1.0))

    def backward(self, be: Any, grad: Any, out: Any, x: Any) -> tuple:
        """da = dc·(½(1 + t) + ½x(1 − t²)·k(1 + 3a·x²))"""
        t = be.tanh(be.mul(be.add(x, be.mul(be.mul(be.square(x), x), A)), K))
        left = be.mul(be.add(t, 1.0), 0.5)
        right = be.mul(be.mul(be.mul(x, 0.5), be.sub(1.0, be.square(t))),
                       be.mul(be.add(be.mul(be.square(x), 3 * A), 1.0), K))
        return (be.mul(grad, be.add(left, right)),)


for cls in (Softmax, Gelu):
    if cls.name not in ops.OPERATIONS and cls.name not in RULES:
        ops.register(cls)


class Norm(Module):
    def __init__(self, width: int, backend: Any) -> None:
        self.weight = Parameter(np.ones(width), backend)
        self.bias = Parameter(np.zeros(width), backend)

    def __call__(self, tape: Any, x: Any) -> Any:
        return tape.apply(LayerNorm(), [x, self.weight.var(tape), self.bias.var(tape)])


class Block(Module):
    def __init__(self, c: TransformerConfig, backend: Any, rng: Any) -> None:
        w = c.width
        self.ln1 = Norm(w, backend)
        self.query, self.key, self.value, self.out = (
            Linear(w, w, backend=backend, rng=rng) for _ in range(4))
        self.ln2 = Norm(w, backend)
        self.fc = Linear(w, 4 * w, backend=backend, rng=rng)
        self.proj = Linear(4 * w, w, backend=backend, rng=rng)
        self.heads = c.heads

    def __call__(self, tape: Any, x: Any) -> Any:
        B, T, C = x.shape
        H = self.heads
        h = self.ln1(tape, x)
        q, k, v = (tape.transpose(tape.reshape(lin(tape, h), (B, T, H, C // H)), 1, 2)
                   for lin in (self.query, self.key, self.value))
        scores = tape.div(tape.matmul(q, tape.transpose(k, -1, -2)), math.sqrt(C // H))
        y = tape.matmul(tape.apply(ops.OPERATIONS["softmax"](causal=True), [scores]), v)
        x = tape.add(x, self.out(tape, tape.reshape(tape.transpose(y, 1, 2), (B, T, C))))
        g = tape.apply(ops.OPERATIONS["gelu"](), [self.fc(tape, self.ln2(tape, x))]) \
            if "gelu" in ops.OPERATIONS else tape.gelu(self.fc(tape, self.ln2(tape, x)))
        return tape.add(x, self.proj(tape, g))


class Transformer(Module):
    def __init__(self, config: TransformerConfig | None = None, backend: Any = "cpu",
                 seed: int = 0) -> None:
        self.config = c = config or TransformerConfig()
        rng = np.random.default_rng(seed)
        self.tokens = Embedding(c.vocab, c.width, backend=backend, rng=rng)
        self.positions = Embedding(c.context, c.width, backend=backend, rng=rng)
        self.blocks = [Block(c, backend, rng) for _ in range(c.layers)]
        self.ln_f = Norm(c.width, backend)
        self.head = Linear(c.width, c.vocab, backend=backend, rng=rng)

    def logits(self, tape: Any, contexts: Any) -> Any:
        T = contexts.shape[1]
        x = tape.add(self.tokens(tape, contexts), self.positions(tape, np.arange(T)))
        for block in self.blocks:
            x = block(tape, x)
        return self.head(tape, self.ln_f(tape, x))

    def loss(self, tape: Any, contexts: Any, targets: Any) -> Any:
        return tape.apply(CrossEntropy(targets), [self.logits(tape, contexts)])


def install() -> None:
    import smallem.models as models

    if "smallem.models.transformer" in sys.modules or _real():
        return
    module = types.ModuleType("smallem.models.transformer")
    module.Transformer, module.TransformerConfig = Transformer, TransformerConfig
    sys.modules["smallem.models.transformer"] = module
    models.transformer = module


def _real() -> bool:
    try:
        import smallem.models.transformer  # noqa: F401
    except ImportError:
        return False
    return True

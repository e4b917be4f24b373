"""A small GPT: causal self-attention over the bytes before each position (lessons 11 and 12).

tokens (B, T) ─► token + position embeddings (B, T, C) ─► blocks ─► final LayerNorm ─► logits (B, T, V)
block: x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)) with GELU (pre-LN, as GPT-2).
Built from nn.py's Embedding, Linear and LayerNorm on the same tape as the MLP beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..autodiff.attention import attention
from ..autodiff.checkpoint import checkpoint
from ..autodiff.operations import cross_entropy, softmax
from ..autodiff.qkv_attention import qkv_attention
from ..autodiff.tape import Tape, Var
from ..backends import DEFAULT_BACKEND, Backend, on_device
from ..data import VOCAB
from ..errors import SmallemError
from ..nn import Embedding, LayerNorm, Linear, Module

ATTENTION_CHOICES = ("auto", "fused", "unfused")


@dataclass
class TransformerConfig:
    layers: int = 2  # blocks, one after the other
    width: int = 128  # numbers per position (C), the residual stream's width
    heads: int = 4  # attention heads per block; each reads width/heads = 32 numbers (D)
    context: int = 64  # bytes seen at once (T): position t attends to positions 0..t
    vocab: int = VOCAB  # 256 bytes + the document boundary (V)
    attention: str = "auto"  # fused (one node keeping O and the log-sum-exp), unfused, or auto:
    #                          fused on the GPU, where its kernel runs; unfused on the CPU
    checkpoint_blocks: bool = False  # keep only each block's input; recompute it in backward
    HOW: ClassVar[tuple[str, ...]] = ("attention", "checkpoint_blocks")  # how, not what: a run
    #                                  may resume with them changed (the same function is computed)

    def __post_init__(self) -> None:
        for name in ("layers", "width", "heads", "context", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise SmallemError(f"the Transformer's {name} must be a whole number of at "
                                   f"least 1, got {value!r}")
        if self.attention not in ATTENTION_CHOICES:
            raise SmallemError(f"the Transformer's attention must be one of "
                               f"{', '.join(ATTENTION_CHOICES)}, got {self.attention!r}")
        if not isinstance(self.checkpoint_blocks, (bool, np.bool_)):
            raise SmallemError(f"checkpoint_blocks must be True or False, got "
                               f"{self.checkpoint_blocks!r}")
        if self.width % self.heads:
            raise SmallemError(f"the width ({self.width}) must split evenly into {self.heads} "
                               f"heads: choose a width that is a multiple of the heads")


class KVCache:
    """Each block's keys and values (B, H, T, D), filled for the `length` positions read so far,
    and the tokens at them: generation runs one new position against them, not the window again."""

    def __init__(self, config: TransformerConfig, backend: Backend, batch: int = 1,
                 attend: Any = None) -> None:
        self.attend = attend  # lesson 16: the learner's one-position step, (q, keys, values) -> out
        shape = (batch, config.heads, config.context, config.width // config.heads)
        self.keys = [backend.zeros(shape) for _ in range(config.layers)]
        self.values = [backend.zeros(shape) for _ in range(config.layers)]
        self.length, self.context = 0, config.context
        self.tokens: list[int] = []  # batch 1: what the positions hold, for the reader and tests


class CausalSelfAttention(Module):
    """H heads of softmax(q kᵀ/√D, causal) v side by side, mixed by one output Linear."""

    def __init__(self, config: TransformerConfig, backend: Backend | str,
                 rng: np.random.Generator) -> None:
        c = config.width
        self.heads = config.heads
        self.fused = config.attention
        self._scales: dict[str, Any] = {}  # backend name -> 1/√D on that backend
        self.query = Linear(c, c, backend=backend, rng=rng)
        self.key = Linear(c, c, backend=backend, rng=rng)
        self.value = Linear(c, c, backend=backend, rng=rng)
        self.output = Linear(c, c, backend=backend, rng=rng)

    def split(self, tape: Tape, x: Var) -> Var:
        """(B, T, C) -> (B, H, T, D): each head gets its own D = C/H channels."""
        b, t, c = x.shape
        return tape.transpose(tape.reshape(x, (b, t, self.heads, c // self.heads)), 1, 2)

    def scale(self, tape: Tape, width: int) -> Any:
        """1/√D, which keeps the scores' spread near 1 whatever D: softmax does not saturate at
        init. Made once per backend: a captured GPU step must find it there, not upload it."""
        be = tape.backend
        if be.name not in self._scales:
            self._scales[be.name] = be.tensor(1.0 / np.sqrt(width // self.heads))
        return self._scales[be.name]

    def forward(self, tape: Tape, x: Var, residual: Var | None = None) -> Var:
        """(B, T, C) -> (B, T, C), plus `residual` when given (added by the output Linear)."""
        b, t, c = x.shape
        fused = self.fused == "fused" or (self.fused == "auto" and tape.backend.name == "gpu")
        if fused and tape.fused and not tape.rules and "qkv_attention" in tape.backend.fused_forward:
            # where the backend fuses it (the GPU): q, k, v from one product, then the attention
            params = [p.var(tape) for lin in (self.query, self.key, self.value)
                      for p in (lin.weight, lin.bias)]
            mixed = qkv_attention(tape, x, *params, heads=self.heads)  # (B, H, T, D)
            return self.output(tape, tape.reshape(tape.transpose(mixed, 1, 2), (b, t, c)), residual)
        q = self.split(tape, self.query(tape, x))  # (B, H, T, D)
        k = self.split(tape, self.key(tape, x))  # (B, H, T, D)
        v = self.split(tape, self.value(tape, x))  # (B, H, T, D)
        if fused:
            # (B, H, T, D), no (T, T) kept; the Linears around it read O, dQ, dK, dV in 16 bits
            mixed = attention(tape, q, k, v, causal=True, copies=True)
            return self.output(tape, tape.reshape(tape.transpose(mixed, 1, 2), (b, t, c)), residual)
        scores = tape.mul(q @ tape.transpose(k, -2, -1), self.scale(tape, c))  # (B, H, T, T)
        weights = softmax(tape, scores, causal=True)  # (B, H, T, T), 0 where j > i
        mixed = weights @ v  # (B, H, T, D)
        merged = tape.reshape(tape.transpose(mixed, 1, 2), (b, t, c))  # (B, T, C)
        return self.output(tape, merged, residual)

    __call__ = forward

    def cached(self, tape: Tape, x: Var, cache: KVCache, layer: int) -> Var:
        """x (B, t, C) at positions L..L+t−1, the keys and values of 0..L−1 in `cache`: the same
        rows as `forward` over all L+t positions, with t query rows only (no gradient)."""
        b, t, c = x.shape
        start, end = cache.length, cache.length + t
        q = self.split(tape, self.query(tape, x))  # (B, H, t, D)
        cache.keys[layer][:, :, start:end] = tape.value(self.split(tape, self.key(tape, x)))
        cache.values[layer][:, :, start:end] = tape.value(self.split(tape, self.value(tape, x)))
        keys, values = cache.keys[layer][:, :, :end], cache.values[layer][:, :, :end]  # (B, H, L+t, D)
        if cache.attend is not None and t == 1:  # one new row sees every key: no mask to apply
            be = tape.backend
            out = cache.attend(*(np.asarray(be.to_numpy(a)) for a in (tape.value(q), keys, values)))
            return self.output(tape, tape.reshape(tape.transpose(be.tensor(out), 1, 2), (b, t, c)))
        scores = tape.mul(q @ tape.transpose(keys, -2, -1), self.scale(tape, c))  # (B, H, t, L+t)
        mask = tape.backend.tensor(np.triu(np.full((t, end), -np.inf), k=start + 1))  # j > L+i
        weights = softmax(tape, scores + mask)  # (B, H, t, L+t)
        merged = tape.reshape(tape.transpose(weights @ values, 1, 2), (b, t, c))  # (B, t, C)
        return self.output(tape, merged)


class FeedForward(Module):
    """Per position: Linear C → 4C, GELU, Linear 4C → C."""

    def __init__(self, config: TransformerConfig, backend: Backend | str,
                 rng: np.random.Generator) -> None:
        self.expand = Linear(config.width, 4 * config.width, backend=backend, rng=rng)
        self.contract = Linear(4 * config.width, config.width, backend=backend, rng=rng)

    def forward(self, tape: Tape, x: Var, residual: Var | None = None) -> Var:
        """(B, T, C) -> (B, T, C), plus `residual` when given (added by the contract Linear)."""
        return self.contract(tape, tape.gelu(self.expand(tape, x)), residual)  # GELU of (B, T, 4C)

    __call__ = forward


class Block(Module):
    """Pre-LN: each half normalises its input and adds its output back onto the residual
    stream, so the gradient reaches early layers through the additions untouched."""

    def __init__(self, config: TransformerConfig, backend: Backend | str,
                 rng: np.random.Generator) -> None:
        self.attention_norm = LayerNorm(config.width, backend=backend)
        self.attention = CausalSelfAttention(config, backend, rng)
        self.mlp_norm = LayerNorm(config.width, backend=backend)
        self.mlp = FeedForward(config, backend, rng)

    def forward(self, tape: Tape, x: Var) -> Var:
        # x + attention(...), x + mlp(...): each add made by the Linear that ends the half (on
        # the GPU the product reads x and adds it; elsewhere an add node, as written here)
        x = self.attention(tape, self.attention_norm(tape, x), residual=x)  # (B, T, C)
        return self.mlp(tape, self.mlp_norm(tape, x), residual=x)  # (B, T, C)

    __call__ = forward

    def cached(self, tape: Tape, x: Var, cache: KVCache, layer: int) -> Var:
        x = x + self.attention.cached(tape, self.attention_norm(tape, x), cache, layer)
        return x + self.mlp(tape, self.mlp_norm(tape, x))  # (B, t, C)


class Transformer(Module):
    """471,041 parameters with the defaults (as PyTorch counts the same architecture):
    token.weight, position.weight, blocks.0.attention_norm.weight, blocks.0.attention.query.weight
    ... blocks.1.mlp.contract.bias, final_norm.weight, final_norm.bias, head.weight, head.bias.
    Every weight starts N(0, 0.02) as the MLP's (no GPT-2 rescaling of the residual outputs),
    LayerNorms at weight 1, bias 0."""

    def __init__(self, config: TransformerConfig | None = None,
                 backend: Backend | str = DEFAULT_BACKEND, seed: int = 0) -> None:
        self.config = c = config or TransformerConfig()
        rng = np.random.default_rng(seed)  # one generator, drawn in this order: same weights everywhere
        self.token = Embedding(c.vocab, c.width, backend=backend, rng=rng)
        self.position = Embedding(c.context, c.width, backend=backend, rng=rng)
        self.blocks = [Block(c, backend, rng) for _ in range(c.layers)]
        self.final_norm = LayerNorm(c.width, backend=backend)
        self.head = Linear(c.width, c.vocab, backend=backend, rng=rng)

    def features(self, tape: Tape, inputs: Any) -> Var:
        """inputs (B, T) integers -> the final normalised stream (B, T, C)."""
        shape = np.shape(inputs)
        if len(shape) != 2 or not 1 <= shape[1] <= self.config.context:
            raise SmallemError(f"the Transformer reads inputs of shape (B, T) with T from 1 to "
                               f"its context {self.config.context}; got {list(shape)}")
        # A full window reads the whole position table (no index to upload: a captured GPU
        # step uploads nothing but its batch); a shorter one (a prompt) its first T rows.
        t = shape[1]
        position = (self.position.weight.var(tape) if t == self.config.context
                    else self.position(tape, np.arange(t)))  # (T, C)
        x = self.token(tape, inputs) + position  # (B, T, C)
        for block in self.blocks:  # checkpointed: only x is kept, the block reruns in backward
            x = checkpoint(tape, block, x, module=block) if self.config.checkpoint_blocks \
                else block(tape, x)  # (B, T, C)
        return self.final_norm(tape, x)  # (B, T, C)

    def logits(self, tape: Tape, inputs: Any) -> Var:
        """inputs (B, T) integers -> logits (B, T, V): row t predicts the byte after input t."""
        return self.head(tape, self.features(tape, inputs))

    def cached_logits(self, tape: Tape, inputs: Any, cache: KVCache) -> Var:
        """inputs (B, t) at positions L..L+t−1 after the L in `cache` -> logits (B, t, V), equal
        to `logits` over all L+t positions' last t rows; the cache then holds L+t positions."""
        t, start = np.shape(inputs)[1], cache.length
        if start + t > self.config.context:
            raise SmallemError(f"the cache holds {start} of {self.config.context} positions, no "
                               f"room for {t} more: start a new cache from the last tokens")
        x = self.token(tape, inputs) + self.position(tape, np.arange(start, start + t))  # (B, t, C)
        for layer, block in enumerate(self.blocks):
            x = block.cached(tape, x, cache, layer)  # (B, t, C)
        cache.length += t
        return self.head(tape, self.final_norm(tape, x))  # (B, t, V)

    def loss(self, tape: Tape, inputs: Any, targets: Any) -> Var:
        """Mean cross-entropy in nats. targets (B, T): every position predicts its next byte
        (training). targets (B,): the last position only, the byte after the window, the one
        prediction the MLP makes (evaluation on the MLP's held-out targets)."""
        if np.ndim(targets) == 2:
            return cross_entropy(tape, self.logits(tape, inputs), targets)
        if np.shape(targets) != np.shape(inputs)[:1]:
            raise SmallemError(f"targets must be (B, T) like the inputs {list(np.shape(inputs))}, "
                               f"or (B,) for the last position; got {list(np.shape(targets))}")
        x = self.features(tape, inputs)  # (B, T, C)
        t = x.shape[1]
        last = tape.matmul(np.eye(1, t, t - 1), x)  # (1, T) @ (B, T, C) -> (B, 1, C): row T−1
        last_targets = targets if on_device(targets) else np.asarray(targets)  # device or host
        return cross_entropy(tape, self.head(tape, last), last_targets.reshape(-1, 1))

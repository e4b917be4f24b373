"""The Bengio et al. (2003) byte model: the 16 previous bytes in, 257 scores out.

tokens (B, T) ─► embedding (B, T, C) ─► side by side (B, T·C) ─► tanh(hidden) ─► logits (B, V)
Built from nn.py's Embedding and Linear; trained by training/loop.py like every other model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..autodiff.operations import cross_entropy
from ..autodiff.tape import Tape, Var
from ..backends import DEFAULT_BACKEND, Backend
from ..data import CONTEXT, VOCAB
from ..nn import Embedding, Linear, Module


@dataclass
class MlpConfig:
    context: int = CONTEXT  # bytes seen before the one to predict (T): 16
    embed: int = 32  # numbers per byte vector (C)
    hidden: int = 512  # units of the tanh layer
    vocab: int = VOCAB  # 256 bytes + the document boundary (V)


class Mlp(Module):
    """402,721 parameters with the defaults: embedding.weight, hidden.weight, hidden.bias,
    output.weight, output.bias."""

    def __init__(self, config: MlpConfig | None = None, backend: Backend | str = DEFAULT_BACKEND,
                 seed: int = 0) -> None:
        self.config = config or MlpConfig()
        c = self.config
        rng = np.random.default_rng(seed)  # one generator, drawn in this order: same weights everywhere
        self.embedding = Embedding(c.vocab, c.embed, backend=backend, rng=rng)
        self.hidden = Linear(c.context * c.embed, c.hidden, backend=backend, rng=rng)
        self.output = Linear(c.hidden, c.vocab, backend=backend, rng=rng)

    def logits(self, tape: Tape, contexts: Any) -> Var:
        """contexts (B, T) integers -> logits (B, V)."""
        batch = len(contexts)
        embedded = self.embedding(tape, contexts)  # (B, T, C)
        # Side by side, each position keeps its own slot: the hidden layer knows which byte
        # sat where.
        flat = tape.reshape(embedded, (batch, self.config.context * self.config.embed))
        hidden = tape.tanh(self.hidden(tape, flat))  # (B, H)
        return self.output(tape, hidden)  # (B, V)

    def loss(self, tape: Tape, contexts: Any, targets: Any) -> Var:
        """Mean cross-entropy of the next byte, in nats."""
        return cross_entropy(tape, self.logits(tape, contexts), targets)

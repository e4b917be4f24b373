"""The bigram baseline of article 3: the next byte from the last one only.

A (V, V) table of logits, row = previous token. It can be trained by the same loop as the MLP
(`smallem train --model bigram`) or fitted in closed form from smoothed counts, which is the
best any bigram can do on its training data; the MLP's gain is measured against that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..autodiff.operations import cross_entropy
from ..autodiff.tape import Tape, Var
from ..backends import DEFAULT_BACKEND, Backend
from ..data import CONTEXT, VOCAB
from ..nn import Embedding, Module

SMOOTHING = 0.1  # add-α: a pair never seen in training still gets a small probability


@dataclass
class BigramConfig:
    context: int = CONTEXT  # bytes it is handed, the MLP's windows (it reads the last one only)
    vocab: int = VOCAB  # 256 bytes + the document boundary (V)


class Bigram(Module):
    """table.weight (V, V): row p holds the logits of the byte after byte p."""

    def __init__(self, config: BigramConfig | None = None, backend: Backend | str = DEFAULT_BACKEND,
                 seed: int = 0) -> None:
        self.config = config or BigramConfig()
        vocab = self.config.vocab
        self.table = Embedding(vocab, vocab, backend=backend, rng=np.random.default_rng(seed))

    def logits(self, tape: Tape, contexts: Any) -> Var:
        """contexts (B, T) integers -> logits (B, V), read from the last token only."""
        return self.table(tape, np.asarray(contexts)[:, -1])

    def loss(self, tape: Tape, contexts: Any, targets: Any) -> Var:
        return cross_entropy(tape, self.logits(tape, contexts), targets)

    @classmethod
    def fit(cls, tokens: np.ndarray, vocab: int = VOCAB, smoothing: float = SMOOTHING,
            backend: Backend | str = DEFAULT_BACKEND) -> Bigram:
        """The closed-form fit: logits = log of smoothed pair frequencies."""
        model = cls(BigramConfig(vocab=vocab), backend)
        model.table.weight.assign(bigram_log_probs(tokens, vocab, smoothing), "table.weight")
        return model


def bigram_log_probs(tokens: np.ndarray, vocab: int = VOCAB, smoothing: float = SMOOTHING
                     ) -> np.ndarray:
    """log P(next | previous) from the counts of consecutive pairs, plus `smoothing` each."""
    t = np.asarray(tokens, dtype=np.int64)
    counts = np.bincount(t[:-1] * vocab + t[1:], minlength=vocab * vocab).reshape(vocab, vocab)
    counts = counts + smoothing
    return np.log(counts) - np.log(counts.sum(axis=1, keepdims=True))

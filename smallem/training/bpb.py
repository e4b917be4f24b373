"""Bits per byte: every model, on bytes or on tokens, scored on the same held-out bytes.

A model's summed loss over a fixed span of held-out bytes (a token model: over the tokens that
cover exactly those bytes), in bits, divided by the number of bytes. Nats per target, the mean
loss over the predictions the model makes there, sits beside it: it changes with the vocabulary,
bits per byte does not. Used by the loop's final evaluation and by lesson 16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..autodiff.tape import Tape
from ..data import BOUNDARY, PAD
from ..errors import SmallemError
from ..nn import Module
from ..tokens import Tokenizer

SPAN_BYTES = 32_768  # held-out bytes scored, from the held-out part's start
ROWS = 4_096  # predictions per forward pass: bounds the logits' memory (V = 2,048: 32 MB)


@dataclass
class Score:
    bits_per_byte: float  # Σ loss / ln 2 / bytes
    nats_per_target: float  # Σ loss / predictions: the model's own unit, vocabulary-dependent
    bytes: int  # what was scored (a boundary counts as one, as in the byte stream)
    targets: int  # predictions made: bytes for a byte model, fewer tokens for a token model

    def to_json(self) -> dict[str, float | int]:
        return dict(vars(self))


def held_out_span(held_out: np.ndarray, n_bytes: int = SPAN_BYTES) -> np.ndarray:
    """A boundary, then the held-out part's first `n_bytes` symbols (bytes and the boundaries
    between its documents): what every model is scored on, all but that first boundary, which
    is only read."""
    stream = np.asarray(held_out, dtype=np.int64)
    body = stream[1:] if stream.size and stream[0] == BOUNDARY else stream
    if body.size == 0:
        raise SmallemError("the held-out part is empty: bits per byte needs held-out text; use "
                           "a larger corpus")
    return np.concatenate([[BOUNDARY], body[:n_bytes]])


def _nats(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """−log softmax(logits)[target] for each row, in float64."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    log_sum = np.log(np.exp(z).sum(axis=-1))
    return log_sum - np.take_along_axis(z, targets[:, None], axis=-1)[:, 0]


def _logits(model: Module, inputs: np.ndarray) -> np.ndarray:
    backend = model.parameters()[0].backend
    tape = Tape(backend)
    out = backend.to_numpy(tape.value(model.logits(tape, inputs)))
    tape.close()
    return np.asarray(out)


def _window_losses(model: Module, stream: np.ndarray, context: int) -> np.ndarray:
    """A window model (the MLP, the bigram): each target from the `context` before it (PAD
    before the span's start, as in training); target j + 1 reads padded[j : j + context]."""
    padded = np.concatenate([np.full(context - 1, PAD, np.int64), stream])
    out = []
    for start in range(0, stream.size - 1, ROWS):
        at = np.arange(start, min(start + ROWS, stream.size - 1))[:, None] + np.arange(context)
        out.append(_nats(_logits(model, padded[at]), stream[at[:, 0] + 1]))  # padded[j] ends at j
    return np.concatenate(out)


def _sequence_losses(model: Module, stream: np.ndarray, context: int) -> np.ndarray:
    """A sequence model: windows of `context` moved by half of it, each target scored once,
    from the window where it has at least half a window before it (the first: all)."""
    n = stream.size - 1  # targets
    t = min(context, n)
    stride = max(1, t // 2)
    starts = list(range(0, n - t + 1, stride))
    if starts[-1] != n - t:
        starts.append(n - t)
    losses = np.empty(n)
    done = 0  # targets scored so far: 0..done-1
    per_batch = max(1, ROWS // t)
    for k in range(0, len(starts), per_batch):
        batch = np.array(starts[k:k + per_batch])
        at = batch[:, None] + np.arange(t)  # (B, t) input positions; targets at + 1
        z = _logits(model, stream[at])  # (B, t, V)
        for row, start in enumerate(batch.tolist()):
            first = done - start  # the first target of this window not yet scored
            losses[done:start + t] = _nats(z[row, first:], stream[at[row, first:] + 1])
            done = start + t
    return losses


def bits_per_byte(model: Module, span: np.ndarray, tokenizer: Tokenizer | None = None) -> Score:
    """Score `model` on `span` (from `held_out_span`): every symbol after its first predicted
    from those before it; with `tokenizer`, the model reads and predicts the span's tokens."""
    span = np.asarray(span, dtype=np.int64)
    stream = span if tokenizer is None else tokenizer.encode(span)
    if stream.size < 2:
        raise SmallemError("the span scored holds nothing after its first boundary: pass one "
                           "from held_out_span on a held-out part with text")
    config = getattr(model, "config", None)
    context = getattr(config, "context", 1)  # the bigram reads its last byte only
    probe = _logits(model, stream[None, :min(context, stream.size - 1)])
    losses = (_sequence_losses if probe.ndim == 3 else _window_losses)(model, stream, context)
    total = float(losses.sum())
    n_bytes = span.size - 1
    return Score(total / math.log(2) / n_bytes, total / losses.size, n_bytes, int(losses.size))


"""Held-out evaluation: the fixed batches every run is scored on, the mean loss over them, and the
closed-form bigram baseline on the same targets. training/loop.py calls these at step 0, every
`eval_every` steps and at the end; bits per byte live in bpb.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..autodiff.tape import Tape
from ..backends import Backend, get_backend
from ..data import Corpus, fixed_batches, held_out_sequences
from ..models.bigram import Bigram
from ..models.protocol import LanguageModel
from ..ranks import World
from .config import EVAL_BATCH, TrainConfig
from .generate import model_backend

# Held-out rows the periodic evaluations of a run read, all together, per training row: scoring
# a row is a forward pass, about a third of a training step's work on it, so 0.3 keeps them near
# a tenth of the training time. The final evaluation always reads every batch (8,192 targets).
EVAL_SHARE = 0.3


def periodic_batches(config: TrainConfig) -> int:
    """How many of the `eval_batches` held-out batches step 0's and every `eval_every`-th
    evaluation read: all of them in a run long enough (the defaults), fewer in a short run, so
    that evaluating does not dwarf training (a 20-step CPU Transformer run reads 1, not 32)."""
    evaluations = 1 + config.steps // config.eval_every  # step 0, then every eval_every
    afford = int(EVAL_SHARE * config.steps * config.batch / (evaluations * EVAL_BATCH))
    return max(1, min(config.eval_batches, afford))


def spread(batches: list, count: int) -> list:
    """`count` of `batches`, evenly spaced over them (the held-out text's whole length)."""
    if count >= len(batches):
        return batches
    return [batches[int(i)] for i in np.linspace(0, len(batches) - 1, count).round()]


def evaluate(model: LanguageModel, batches: Sequence[tuple[np.ndarray, np.ndarray]],
             world: World | None = None, bar: Any = None) -> float:
    """Mean loss over `batches` (no gradients), read from the device once. With a `world` of
    several ranks, each scores every size-th batch and the sums are added: evaluated once.
    `bar` (a progress bar) advances by one per batch scored here."""
    # float32 products whatever the run's precision: held-out losses of runs in different
    # precisions then compare the models, not the formats' rounding
    backend = get_backend(model_backend(model).name)
    total = backend.zeros(())
    mine = batches if world is None else batches[world.rank::world.size]
    for contexts, targets in mine:
        tape = Tape(backend)
        total = backend.add(total, tape.value(model.loss(tape, contexts, targets)))
        tape.close()  # never differentiated: done with, parameters may change
        if bar is not None:
            bar.update(1)
    value = backend.item(total)
    if world is not None and world.size > 1:
        value = float(world.allreduce(np.array([value]))[0])
    return value / len(batches)


def held_out_batches(config: TrainConfig, corpus: Corpus, last_only: bool = True) -> list:
    """The fixed held-out batches a model is scored on: always the MLP's targets, each seen
    through the model's own window (a sequence model: the T bytes before it, scored at the last
    position; `last_only=False`: every position of those windows)."""
    if not config.sequences:
        return fixed_batches(corpus.held_out, EVAL_BATCH, config.eval_batches, config.sizes.context)
    return held_out_sequences(corpus.held_out, EVAL_BATCH, config.eval_batches,
                              config.sizes.context, scored_context=config.scored_context,
                              last_only=last_only)


def bigram_baseline(config: TrainConfig, corpus: Corpus, backend: Backend) -> float:
    """The closed-form bigram's held-out loss on the same targets: the number a model must beat."""
    scored = fixed_batches(corpus.held_out, EVAL_BATCH, config.eval_batches, config.scored_context)
    return evaluate(Bigram.fit(corpus.train, config.sizes.vocab, backend=backend), scored)

"""Held-out evaluation: the fixed batches every run is scored on, the mean loss over them, and the
closed-form bigram baseline on the same targets. training/loop.py calls these at step 0, every
`eval_every` steps and at the end; bits per byte live in bpb.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..autodiff.tape import Tape
from ..backends import Backend, get_backend
from ..data import Corpus, fixed_batches, held_out_sequences
from ..models.bigram import Bigram
from ..models.protocol import LanguageModel
from ..ranks import World
from .config import EVAL_BATCH, TrainConfig
from .generate import model_backend


def evaluate(model: LanguageModel, batches: Sequence[tuple[np.ndarray, np.ndarray]],
             world: World | None = None) -> float:
    """Mean loss over `batches` (no gradients), read from the device once. With a `world` of
    several ranks, each scores every size-th batch and the sums are added: evaluated once."""
    # float32 products whatever the run's precision: held-out losses of runs in different
    # precisions then compare the models, not the formats' rounding
    backend = get_backend(model_backend(model).name)
    total = backend.zeros(())
    mine = batches if world is None else batches[world.rank::world.size]
    for contexts, targets in mine:
        tape = Tape(backend)
        total = backend.add(total, tape.value(model.loss(tape, contexts, targets)))
        tape.close()  # never differentiated: done with, parameters may change
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

"""What bench and its scripts run: a model by name (the MLP, or the Transformer at each device's
size) and batches of byte sequences. Shared by bench.py, calls.py and benchmarks/."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..data import SequenceSampler
from ..models.mlp import Mlp, MlpConfig
from ..models.transformer import Transformer, TransformerConfig

SMALL_TRANSFORMER = {"width": 64}  # the CPU rows' Transformer: the size a CPU lesson trains


def transformer_config(device: str) -> TransformerConfig:
    """The Transformer timed: the default one on a GPU, the smaller one on a CPU."""
    return TransformerConfig() if device == "gpu" else TransformerConfig(**SMALL_TRANSFORMER)


def build(model: str, backend: Any, seed: int, device: str = "gpu") -> Any:
    """"mlp" or "transformer" on `backend`, from `seed`: the same weights on every backend."""
    if model == "transformer":
        return Transformer(transformer_config(device), backend, seed=seed)
    return Mlp(MlpConfig(), backend, seed=seed)


def sequence_batches(tokens: np.ndarray, batch: int, context: int, count: int, seed: int
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """`count` batches as training draws them: inputs (B, T) and the next byte at every
    position (B, T)."""
    sampler = SequenceSampler(tokens, batch, context, seed=seed)
    return [sampler.next() for _ in range(count)]

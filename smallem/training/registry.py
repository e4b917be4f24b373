"""The one registry of models: every model `smallem train --model NAME` can build, with all that
the rest of smallem needs to know of it (its class and config, what it reads, its defaults, its
measured learning rates, the sizes `smallem bench` times). A new model is its file in models/
plus one `register(...)`: the command line, the checks, checkpoints and bench read this table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

from ..backends import Backend
from ..errors import SmallemError
from ..models.bigram import Bigram, BigramConfig
from ..models.mlp import Mlp, MlpConfig
from ..models.protocol import LanguageModel
from ..models.transformer import Transformer, TransformerConfig

WINDOWS = "windows"  # (B, T) windows in, the (B,) byte after each window to predict
SEQUENCES = "sequences"  # (B, T) sequences in, every position's next byte (B, T) to predict
BATCH = 256  # examples per step, the seed's: every default batch size of the MLP reads it


@dataclass(frozen=True)
class ModelEntry:
    name: str  # what --model takes
    model: Callable[..., LanguageModel]  # model(config, backend, seed=seed)
    config: type  # a dataclass with `context` and `vocab`; its defaults are the model's sizes
    reads: str  # WINDOWS or SEQUENCES
    batch: int  # examples per step when --batch is left out
    steps: int  # optimizer steps when --steps is left out
    learning_rates: Mapping[str, float]  # optimizer name -> its measured rate on this model
    summary: str  # what --model's help says of it
    options: Mapping[str, str] = field(default_factory=dict)  # config fields offered as options
    bench: Mapping[str, Any] = field(default_factory=dict)  # device -> the config bench times
    checked: bool = True  # the three checks apply (it can learn one batch by heart)

    def __post_init__(self) -> None:
        if self.reads not in (WINDOWS, SEQUENCES):
            raise SmallemError(f"model {self.name!r} must read {WINDOWS} or {SEQUENCES}, not "
                               f"{self.reads!r}")
        names = {f.name for f in fields(self.config)}
        missing = [n for n in ("context", "vocab", *self.options) if n not in names]
        if missing:
            raise SmallemError(f"model {self.name!r}: its config {self.config.__name__} has no "
                               f"field {missing[0]!r}")

    def build(self, config: Any, backend: Backend | str, seed: int = 0) -> LanguageModel:
        """The model of `config` (this entry's config class) on `backend`, from `seed`."""
        return self.model(config, backend, seed=seed)

    def bench_config(self, device: str) -> Any:
        """The sizes `smallem bench` times on `device` ("gpu" or "cpu"): the defaults unless
        the entry names smaller ones."""
        return self.bench.get(device) or self.config()


_MODELS: dict[str, ModelEntry] = {}


def register(entry: ModelEntry) -> ModelEntry:
    """Add `entry` (a name not taken yet); `unregister` or `registered` take it away again."""
    if entry.name in _MODELS:
        raise SmallemError(f"a model named {entry.name!r} is registered already: choose another "
                           "name, or unregister it first")
    _MODELS[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    _MODELS.pop(name, None)


@contextmanager
def registered(entry: ModelEntry) -> Iterator[ModelEntry]:
    """`entry` registered for the time of a `with` block (a test's throwaway model)."""
    register(entry)
    try:
        yield entry
    finally:
        unregister(entry.name)


def names() -> tuple[str, ...]:
    return tuple(_MODELS)


def entries() -> tuple[ModelEntry, ...]:
    return tuple(_MODELS.values())


def get(name: str) -> ModelEntry:
    """The entry of model `name`, or one sentence listing the models there are."""
    if name not in _MODELS:
        raise SmallemError(f"unknown model {name!r}: choose one of {', '.join(_MODELS)}")
    return _MODELS[name]


def for_config(config: Any) -> ModelEntry:
    """The entry whose config class `config` is an instance of."""
    for entry in _MODELS.values():
        if type(config) is entry.config:
            return entry
    raise SmallemError(f"no registered model is configured by a {type(config).__name__}: pass "
                       f"the config of one of {', '.join(_MODELS)}")


# The learning rates, measured on the default corpus (held-out loss after training).
# The byte MLP, 20,000 steps of batch 256: AdamW lr 3e-4 1.71, 5e-4 1.55, 7e-4 1.50, 1e-3 1.48,
# 1.5e-3 1.49, 2e-3 1.53, 3e-3 1.57, 5e-3 1.68; SGD lr 0.1 1.83, 0.5 1.55.
register(ModelEntry(
    "mlp", Mlp, MlpConfig, WINDOWS, batch=BATCH, steps=20_000,
    learning_rates={"adamw": 1e-3, "sgd": 0.5},
    summary="mlp (Bengio 2003, 402,721 parameters)"))
# The bigram's table learns one row per byte from few examples a step, so it wants far larger
# steps; after 1,500 steps of batch 256 (fitted bigram: 2.427): AdamW 1e-3 crawls (3.9),
# 1e-2 2.457, 3e-2 2.448; SGD 20 2.538, 100 diverges (3.99).
register(ModelEntry(
    "bigram", Bigram, BigramConfig, WINDOWS, batch=BATCH, steps=20_000,
    learning_rates={"adamw": 1e-2, "sgd": 20.0},
    summary="bigram (the last byte only)", checked=False))
# The Transformer (2 × 128 × 4, T 64), 300 CPU steps of batch 64 (held-out, the MLP's targets):
# AdamW lr 1e-3 1.957, 3e-4 2.322. Its SGD rate was not measured (SGD is not how it is trained).
# A Transformer example is a 64-byte sequence, 64 predictions at once: hence the smaller batch.
register(ModelEntry(
    "transformer", Transformer, TransformerConfig, SEQUENCES, batch=64, steps=10_000,
    learning_rates={"adamw": 1e-3, "sgd": 0.1},
    summary="transformer (a small GPT, 471,041 parameters with the defaults)",
    options={"layers": "blocks, one after the other",
             "width": "numbers per position (C)",
             "heads": "attention heads per block (they split the width)",
             "context": "bytes seen at once (T)",
             "attention": "fused (one node keeping O and the log-sum-exp), unfused, or auto "
                          "(fused on a GPU)",
             "checkpoint_blocks": "keep only each block's input, run it again in backward"},
    # The CPU rows time the size a CPU lesson trains; the GPU rows the default one.
    bench={"cpu": TransformerConfig(width=64)}))

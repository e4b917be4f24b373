"""What a training run is: `TrainConfig`, each default written once, and the model it builds.

train.py runs a config, cli.py derives `smallem train`'s options and their help from its
fields (the help shows the defaults read from here), and checkpoints store it as JSON.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from ..backends import BACKEND_NAMES, PRECISIONS, Backend
from ..errors import SmallemError, require
from ..models.bigram import Bigram
from ..models.mlp import Mlp, MlpConfig
from ..models.transformer import Transformer, TransformerConfig
from ..nn import Module
from ..optim import ADAMW_WEIGHT_DECAY, LEARNING_RATES, default_lr

MODELS = ("mlp", "bigram", "transformer")
# What a model trains on when --batch and --steps are left out: the MLP reads one 16-byte
# window per example; a Transformer example is a 64-byte sequence, 64 predictions at once.
BATCH = 256  # examples per step, the seed's: every default batch size of the MLP reads it
MODEL_DEFAULTS = {"mlp": {"batch": BATCH, "steps": 20_000},
                  "bigram": {"batch": BATCH, "steps": 20_000},
                  "transformer": {"batch": 64, "steps": 10_000}}
OPTIMIZERS = ("adamw", "sgd")


def _option(default: Any, help: str, **kw: Any) -> Any:
    """A field that is also a `smallem train` option; `help` is its one line of help."""
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    model: str = _option("mlp", "mlp (Bengio 2003, 402,721 parameters), bigram, or transformer "
                         "(a small GPT, 471,041 parameters with the defaults)")
    backend: str = _option("auto", "auto (the GPU when CuPy sees one, else cpu), cpu, cpu64 "
                           "or gpu")
    steps: int | None = _option(None, "total optimizer steps; a resumed run counts those done; "
                                "left out: " + ", ".join(f"{d['steps']:,} for {m}"
                                                         for m, d in MODEL_DEFAULTS.items()))
    batch: int | None = _option(None, "examples per step (B): windows for mlp, sequences for "
                         "transformer; left out: " + ", ".join(
                             f"{d['batch']} for {m}" for m, d in MODEL_DEFAULTS.items()))
    optimizer: str = _option("adamw", "adamw or sgd")
    lr: float | None = _option(None, "learning rate; left out, the measured default: " + ", ".join(
        f"{v:g} for {m} with {o}" for m, row in LEARNING_RATES.items() for o, v in row.items()))
    weight_decay: float = _option(ADAMW_WEIGHT_DECAY, "AdamW's decay, on matrices only")
    clip: float | None = _option(None, "clip gradients to this global norm before each update "
                                 "(syncs a GPU); left out, never", metavar="NORM")
    seed: int = _option(0, "initial weights and batches both follow from it")
    corpus: str | None = _option(None, "a text file or folder; left out, the Python standard "
                                 "library's sources (no download)")
    log_every: int = _option(500, "steps between log lines (the only times the loss is read)")
    eval_every: int = _option(2000, "steps between held-out evaluations")
    capture: bool = _option(True, "on a GPU, record the training step once as a CUDA graph "
                            "and replay it (--no-capture: launch kernel by kernel)")
    precision: str = _option("fp32", "what the matrix products read: fp32, tf32, bf16 or fp16 "
                             "(float32 sums, weights and optimizer; fp16 with a loss scaler)")
    layers: int = _option(TransformerConfig.layers, "transformer: blocks, one after the other")
    width: int = _option(TransformerConfig.width, "transformer: numbers per position (C)")
    heads: int = _option(TransformerConfig.heads, "transformer: attention heads per block "
                         "(they split the width)")
    context: int = _option(TransformerConfig.context, "transformer: bytes seen at once (T); "
                           "the MLP's window is its own, 16")
    eval_batches: int = field(default=32, metadata={})  # fixed held-out batches of EVAL_BATCH
    save_every: int = field(default=5000, metadata={})  # steps between checkpoints (0: at the end)
    mlp: MlpConfig = field(default_factory=MlpConfig, metadata={})

    # Fields that must match a checkpoint for a resumed run to continue the same run.
    # The corpus is compared by content, not by path (a copy elsewhere will do).
    RUN_FIELDS = ("model", "batch", "optimizer", "lr", "weight_decay", "clip", "seed", "mlp",
                  "layers", "width", "heads", "context")

    def __post_init__(self) -> None:
        """Refuse at once what cannot work; the numbers an optimizer takes (lr, weight_decay,
        clip) are checked by the optimizer, where they are used."""
        if isinstance(self.mlp, dict):  # from a checkpoint's JSON
            self.mlp = MlpConfig(**self.mlp)
        for name, allowed in (("model", MODELS), ("optimizer", OPTIMIZERS),
                              ("backend", BACKEND_NAMES), ("precision", PRECISIONS)):
            if getattr(self, name) not in allowed:
                raise SmallemError(f"unknown {name} {getattr(self, name)!r}: choose one of "
                                   f"{', '.join(allowed)}")
        for name, default in MODEL_DEFAULTS[self.model].items():  # left out: this model's own
            if getattr(self, name) is None:
                setattr(self, name, default)
        for name in ("steps", "batch", "log_every", "eval_every", "eval_batches"):
            require(name.replace("_", " "), getattr(self, name), "count")
        require("the seed", self.seed, "whole")
        require("save every", self.save_every, "whole")
        if self.sequences:
            self.transformer  # noqa: B018 - its sizes are checked where they are built

    @property
    def transformer(self) -> TransformerConfig:
        """The Transformer these fields describe (its sizes are checked here)."""
        return TransformerConfig(layers=self.layers, width=self.width, heads=self.heads,
                                 context=self.context, vocab=self.mlp.vocab)

    @property
    def sequences(self) -> bool:
        """Whether the model reads sequences, every position predicting its next byte."""
        return self.model == "transformer"

    @property
    def learning_rate(self) -> float:
        """`lr`, or the measured default for this model and optimizer."""
        return default_lr(self.optimizer, self.model) if self.lr is None else self.lr

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON, with the learning rate the run used written out."""
        return {**asdict(self), "lr": self.learning_rate}

    @classmethod
    def options(cls) -> list[tuple[str, Any, dict[str, Any]]]:
        """(name, default, metadata) of each field that is a command-line option."""
        return [(f.name, f.default if f.default is not MISSING else None, dict(f.metadata))
                for f in fields(cls) if "help" in f.metadata]


def config_from(saved: dict[str, Any]) -> TrainConfig:
    """The TrainConfig stored in a checkpoint's JSON."""
    known = {f.name for f in fields(TrainConfig)}
    try:
        return TrainConfig(**{k: v for k, v in saved.items() if k in known})
    except TypeError:
        raise SmallemError("the checkpoint's config cannot be read: it was written by another "
                           "version of smallem") from None


def build_model(config: TrainConfig, backend: Backend | str) -> Module:
    if config.model == "bigram":
        return Bigram(config.mlp.vocab, backend, seed=config.seed)
    if config.model == "transformer":
        return Transformer(config.transformer, backend, seed=config.seed)
    return Mlp(config.mlp, backend, seed=config.seed)

"""What a training run is: `TrainConfig`, each default of a run written once, and the model it
builds (read from the registry of models, registry.py).

training/loop.py runs a config, tools/cli.py derives `smallem train`'s options and their help
from its fields and from the registry's config classes, and checkpoints store it as JSON.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

from ..backends import BACKEND_NAMES, PRECISIONS, Backend
from ..data import CONTEXT, VOCAB
from ..errors import SmallemError, require
from ..models.protocol import LanguageModel
from ..nn import built_for_speed
from ..optim import ADAMW_WEIGHT_DECAY, OPTIMIZERS
from . import registry
from .registry import BATCH, SEQUENCES

EVAL_BATCH = BATCH  # held-out examples per evaluation batch, whatever the training batch
EVAL_BATCHES = 32  # fixed held-out batches of EVAL_BATCH: 8,192 targets, every model the same
TOKENS = ("bytes", "bpe")  # what a model reads: bytes, or byte-pair tokens (tokens.py)
BPE_VOCAB = 2048  # --tokens bpe's vocabulary when --vocab is left out
HEALTH_EVERY = 100  # steps between two training-health samples (--health)
# What 0.3's checkpoints stored flat beside `mlp`: the Transformer's sizes.
LEGACY_TRANSFORMER_FIELDS = ("layers", "width", "heads", "context")


def _defaults(key: str) -> str:
    return ", ".join(f"{getattr(e, key):,} for {e.name}" for e in registry.entries())


def _option(default: Any, help: str, **kw: Any) -> Any:
    """A field that is also a `smallem train` option; `help` is its one line of help."""
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    model: str = _option("mlp", ", ".join(e.summary for e in registry.entries()))
    backend: str = _option("auto", "auto (the GPU when CuPy sees one, else cpu), cpu, cpu64 "
                           "or gpu")
    steps: int | None = _option(None, "total optimizer steps; a resumed run counts those done; "
                                "left out: " + _defaults("steps"))
    batch: int | None = _option(None, "examples per step (B): " + ", ".join(
        f"{e.reads} for {e.name}" for e in registry.entries()) + "; left out: " + _defaults("batch"))
    accumulate: int = _option(1, "micro-batches each rank's share of a batch is split into, their "
                              "gradients summed before one step: the same update, less memory",
                              metavar="K")
    optimizer: str = _option("adamw", "adamw or sgd")
    lr: float | None = _option(None, "learning rate; left out, the measured default: " + ", ".join(
        f"{v:g} for {e.name} with {o}" for e in registry.entries()
        for o, v in e.learning_rates.items()))
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
    tokens: str = _option("bytes", "bytes (257 symbols), or bpe: byte-pair tokens, merges learnt "
                          "from the training part once and cached (or --merges)")
    vocab: int | None = _option(None, f"with --tokens bpe: ids in the vocabulary (256 bytes, the "
                                f"boundary, the merges); left out, {BPE_VOCAB:,}")
    merges: str | None = _option(None, "with --tokens bpe: a merges file written by smallem "
                                 "(a run's cache, named when it learns them)", metavar="FILE")
    eval_batches: int = field(default=EVAL_BATCHES, metadata={})
    save_every: int = field(default=5000, metadata={})  # steps between checkpoints (0: at the end)
    # The model's own config, its class the registry's (MlpConfig for "mlp", TransformerConfig
    # for "transformer", ...); left out, its defaults; a dict (from JSON) is read into it.
    sizes: Any = field(default=None, metadata={})

    # Fields that must match a checkpoint for a resumed run to continue the same run.
    # The corpus is compared by content, not by path (a copy elsewhere will do).
    RUN_FIELDS = ("model", "batch", "optimizer", "lr", "weight_decay", "clip", "seed", "tokens",
                  "sizes")

    def __post_init__(self) -> None:
        """Refuse at once what cannot work; the numbers an optimizer takes (lr, weight_decay,
        clip) are checked by the optimizer, where they are used."""
        for name, allowed in (("model", registry.names()), ("optimizer", OPTIMIZERS),
                              ("backend", BACKEND_NAMES), ("precision", PRECISIONS),
                              ("tokens", TOKENS)):
            if getattr(self, name) not in allowed:
                raise SmallemError(f"unknown {name} {getattr(self, name)!r}: choose one of "
                                   f"{', '.join(allowed)}")
        entry = self.entry
        for name in ("batch", "steps"):  # left out: this model's own
            if getattr(self, name) is None:
                setattr(self, name, getattr(entry, name))
        self.sizes = _sizes(entry, self.sizes)
        self._check_tokens()
        for name in ("steps", "batch", "accumulate", "log_every", "eval_every", "eval_batches"):
            require(name.replace("_", " "), getattr(self, name), "count")
        require("the seed", self.seed, "whole")
        require("save every", self.save_every, "whole")

    def _check_tokens(self) -> None:
        """--vocab and --merges belong to --tokens bpe, whose vocabulary is the model's."""
        if self.tokens == "bytes":
            given = [f"--{n}" for n in ("vocab", "merges") if getattr(self, n) is not None]
            if given:
                raise SmallemError(f"{given[0]} applies to --tokens bpe only: add --tokens bpe, "
                                   f"or drop {given[0]}")
            return
        if self.vocab is None and self.merges is not None:  # the merges file's own vocabulary
            from ..tokens import FIRST_MERGE, load_merges

            self.vocab = FIRST_MERGE + len(load_merges(self.merges))
        if self.vocab is None:
            self.vocab = BPE_VOCAB if self.sizes.vocab == VOCAB else self.sizes.vocab
        require("the vocabulary size", self.vocab, "count")
        if self.vocab <= VOCAB:
            raise SmallemError(f"--vocab {self.vocab} leaves no room for a merge: the 256 bytes "
                               f"and the boundary take {VOCAB}; ask for more, e.g. {BPE_VOCAB}")
        if self.vocab > 2 ** 16:  # here, before merges are learnt for it (tokenize() holds the same)
            raise SmallemError(f"--vocab {self.vocab} does not fit the corpus's 16-bit token streams: "
                               "ask for 65,536 or fewer")
        self.sizes = replace(self.sizes, vocab=self.vocab)

    @property
    def entry(self) -> registry.ModelEntry:
        """The registry's entry of this run's model."""
        return registry.get(self.model)

    @property
    def sequences(self) -> bool:
        """Whether the model reads sequences, every position predicting its next byte."""
        return self.entry.reads == SEQUENCES

    @property
    def scored_context(self) -> int:
        """The window of the held-out targets: a windows model's own, else the MLP's (every
        model is scored on the same targets)."""
        return CONTEXT if self.sequences else self.sizes.context

    @property
    def learning_rate(self) -> float:
        """`lr`, or the measured default for this model and optimizer."""
        return self.entry.learning_rates[self.optimizer] if self.lr is None else self.lr

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON, with the learning rate the run used written out."""
        return {**asdict(self), "lr": self.learning_rate}

    def run_values(self) -> dict[str, Any]:
        """What must match a checkpoint to continue its run, named as the options name them:
        the RUN_FIELDS, the model's sizes one by one (not how it computes: `HOW` fields, such
        as the Transformer's attention and checkpoint_blocks, may change between two legs)."""
        out: dict[str, Any] = {}
        for name in self.RUN_FIELDS:
            if name == "sizes":
                how = getattr(self.sizes, "HOW", ())
                out.update({f.name: getattr(self.sizes, f.name) for f in fields(self.sizes)
                            if f.name not in how})
            else:  # a default lr is a value too
                out[name] = self.learning_rate if name == "lr" else getattr(self, name)
        return out

    def check_same_run(self, saved: TrainConfig) -> None:
        """Refuse to continue `saved`'s run (a checkpoint's) with other settings, naming the
        first that differs (the model first)."""
        theirs = saved.run_values()
        for name, value in self.run_values().items():
            if theirs.get(name) != value:
                raise SmallemError(f"{name} is {value!r} but the checkpoint was trained with "
                                   f"{theirs.get(name)!r}: resume with the same {name} (leave "
                                   "it out on the command line)")

    @classmethod
    def options(cls) -> list[tuple[str, Any, dict[str, Any]]]:
        """(name, default, metadata) of each field that is a command-line option."""
        return [(f.name, f.default if f.default is not MISSING else None, dict(f.metadata))
                for f in fields(cls) if "help" in f.metadata]


def _sizes(entry: registry.ModelEntry, sizes: Any) -> Any:
    """`sizes` as an instance of the model's config class: defaults for None, a dict read in."""
    if sizes is None:
        return entry.config()
    if isinstance(sizes, dict):
        known = {f.name for f in fields(entry.config)}
        unknown = sorted(set(sizes) - known)
        if unknown:
            raise SmallemError(f"the {entry.name} has no size {unknown[0]!r}: its config "
                               f"{entry.config.__name__} has {', '.join(sorted(known))}")
        return entry.config(**sizes)
    if type(sizes) is not entry.config:
        raise SmallemError(f"sizes is a {type(sizes).__name__}, but the {entry.name} is "
                           f"configured by a {entry.config.__name__}: pass one of those, or "
                           "the model it belongs to")
    return sizes


def _from_legacy(saved: dict[str, Any]) -> dict[str, Any]:
    """A 0.3 config (the MLP's sizes under "mlp", the Transformer's flat beside them) in
    today's form: the run's model's sizes under "sizes"."""
    saved = dict(saved)
    mlp = saved.pop("mlp", None) or {}
    flat = {k: saved.pop(k) for k in LEGACY_TRANSFORMER_FIELDS if k in saved}
    model = saved.get("model", "mlp")
    if model == "transformer":
        saved["sizes"] = {**flat, **({"vocab": mlp["vocab"]} if "vocab" in mlp else {})}
    elif model == "bigram":
        saved["sizes"] = {k: mlp[k] for k in ("context", "vocab") if k in mlp}
    else:
        saved["sizes"] = mlp
    return saved


def config_from(saved: dict[str, Any]) -> TrainConfig:
    """The TrainConfig stored in a checkpoint's JSON (0.3's form, flat sizes, read as well)."""
    if "sizes" not in saved:
        saved = _from_legacy(saved)
    known = {f.name for f in fields(TrainConfig)}
    try:
        return TrainConfig(**{k: v for k, v in saved.items() if k in known})
    except TypeError:
        raise SmallemError("the checkpoint's config cannot be read: it was written by another "
                           "version of smallem") from None


def build_model(config: TrainConfig, backend: Backend | str) -> LanguageModel:
    """The model `config` describes, on `backend`, its weights drawn from `config.seed`, built for
    speed (nn.built_for_speed: the float32 CPU's fused Linears, the same numbers as the unfused
    ones): what a training run steps is what bench's CPU rows time."""
    return built_for_speed(config.entry.build(config.sizes, backend, seed=config.seed))


def largest_ask(config: TrainConfig) -> tuple[str, int, int] | None:
    """(name, value, default) of the size, or the batch, furthest above its default: what a run
    that ran out of memory should ask less of (None when nothing is above its default)."""
    defaults = {"batch": config.entry.batch, **asdict(config.entry.config())}
    values = {"batch": config.batch, **asdict(config.sizes)}
    over = {n: v / defaults[n] for n, v in values.items()
            if isinstance(v, int) and n in defaults and v > defaults[n] > 0}
    if not over:
        return None
    name = max(over, key=over.get)
    return name, values[name], defaults[name]

"""Training: one step (forward, backward, update), evaluation, sampling and the loop.

`train_step` knows nothing of the model: it takes a function that builds the loss on a fresh
tape. `train(config)` is the loop behind `smallem train` and the notebooks: a progress bar, a
log line every few steps, held-out evaluations on fixed batches, checkpoints, and a history.
"""

from __future__ import annotations

import math
import signal
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .backends import BACKEND_NAMES, Backend, Tensor, get_backend
from .checkpoint import Checkpoint, load_checkpoint, load_parameters, save_checkpoint
from .data import (BOUNDARY, CONTEXT, BatchSampler, Corpus, decode, encode, fixed_batches,
                   load_corpus)
from .errors import SmallemError
from .models.bigram import Bigram
from .models.mlp import Mlp, MlpConfig
from .nn import Module
from .optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, SGD_LR, Optimizer, make_optimizer
from .tape import Gradients, Tape, Var

EVAL_BATCH = 256  # held-out examples per evaluation batch, whatever the training batch
# The bigram's table learns one row per byte from few examples a step, so it wants far larger
# steps than the MLP. Held-out loss after 1,500 steps of batch 256 (fitted bigram: 2.427):
# AdamW 1e-3 crawls (3.9), 1e-2 2.457, 3e-2 2.448; SGD 20 2.538, 100 diverges (3.99).
BIGRAM_LR = {"adamw": 1e-2, "sgd": 20.0}


@dataclass
class TrainConfig:
    model: str = "mlp"  # "mlp" (Bengio 2003) or "bigram" (article 3's table, trained)
    backend: str = "auto"  # "auto" takes the GPU when CuPy sees one, else "cpu" (float32)
    steps: int = 20_000  # total optimizer steps; a resumed run counts those already done
    batch: int = 256  # examples per step (B)
    optimizer: str = "adamw"  # "adamw" or "sgd"
    lr: float | None = None  # None: ADAMW_LR or SGD_LR for the MLP, BIGRAM_LR for the bigram
    weight_decay: float = ADAMW_WEIGHT_DECAY  # AdamW only, on matrices only
    clip: float | None = None  # clip gradients to this global norm (syncs a GPU); None: never
    seed: int = 0  # initial weights and batches both follow from it
    corpus: str | None = None  # a text file or folder; None: the standard library's sources
    log_every: int = 500  # steps between log lines (the only times the loss is read)
    eval_every: int = 2000  # steps between held-out evaluations
    eval_batches: int = 32  # fixed held-out batches of EVAL_BATCH examples
    save_every: int = 5000  # steps between checkpoints when saving (0: only at the end)
    mlp: MlpConfig = field(default_factory=MlpConfig)

    def __post_init__(self) -> None:
        if isinstance(self.mlp, dict):  # from a checkpoint's JSON
            self.mlp = MlpConfig(**self.mlp)

    def validate(self) -> "TrainConfig":
        """Raise one clear SmallemError for the first value that cannot work; fill in the
        optimizer's default learning rate when lr is None."""
        for name in ("model", "optimizer", "backend"):
            allowed = {"model": ("mlp", "bigram"), "optimizer": ("adamw", "sgd"),
                       "backend": BACKEND_NAMES}[name]
            if getattr(self, name) not in allowed:
                raise SmallemError(f"unknown {name} {getattr(self, name)!r}: choose one of "
                                   f"{', '.join(allowed)}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise SmallemError(f"the seed must be a whole number, 0 or more, got {self.seed!r}")
        for name in ("steps", "batch", "log_every", "eval_every", "eval_batches"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SmallemError(f"{name} must be a whole number of at least 1, got {value!r}")
        if self.lr is None and self.model == "bigram":
            self.lr = BIGRAM_LR[self.optimizer]
        elif self.lr is None:
            self.lr = ADAMW_LR if self.optimizer == "adamw" else SGD_LR
        if not isinstance(self.save_every, int) or self.save_every < 0:
            raise SmallemError(f"save_every must be 0 or more, got {self.save_every!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise SmallemError(f"the learning rate must be a positive number, got {self.lr!r}")
        if self.clip is not None and not (math.isfinite(self.clip) and self.clip > 0):
            raise SmallemError(f"--clip must be a positive number, got {self.clip!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise SmallemError(f"weight decay must be 0 or more, got {self.weight_decay!r}")
        return self

    # Fields that must match a checkpoint for a resumed run to continue the same run.
    # The corpus is compared by content, not by path (a copy elsewhere will do).
    RUN_FIELDS = ("model", "batch", "optimizer", "lr", "weight_decay", "clip", "seed", "mlp")


def build_model(config: TrainConfig, backend: Backend | str) -> Module:
    if config.model == "bigram":
        return Bigram(config.mlp.vocab, backend, seed=config.seed)
    return Mlp(config.mlp, backend, seed=config.seed)


def model_backend(model: Module) -> Backend:
    return model.parameters()[0].backend


# one step --------------------------------------------------------------------------------
def loss_and_gradients(backend: Backend | str, loss_fn: Callable[[Tape], Var]
                       ) -> tuple[Tensor, Gradients]:
    """Build the loss on a new tape and run backward: (loss as a tensor, gradients)."""
    tape = Tape(backend)
    loss = loss_fn(tape)
    return tape.value(loss), tape.backward(loss)


def train_step(backend: Backend | str, model: Module, optimizer: Optimizer,
               loss_fn: Callable[[Tape], Var]) -> Tensor:
    """Forward, backward, update. The loss comes back as a backend tensor, unread: reading a
    GPU number waits for the GPU, so the loop reads it only when it logs. No zero_grad: the
    gradients belong to this step's Gradients and go with it."""
    loss, grads = loss_and_gradients(backend, loss_fn)
    optimizer.step(model.parameters(), grads)
    return loss


def evaluate(model: Module, batches: Sequence[tuple[np.ndarray, np.ndarray]]) -> float:
    """Mean loss over `batches` (no gradients), read from the device once."""
    backend = model_backend(model)
    total = backend.zeros(())
    for contexts, targets in batches:
        tape = Tape(backend)
        total = backend.add(total, tape.value(model.loss(tape, contexts, targets)))
        tape.close()  # never differentiated: done with, parameters may change
    return backend.item(total) / len(batches)


def sample(model: Module, prompt: str | bytes = "", n_bytes: int = 200,
           temperature: float = 1.0, seed: int = 0) -> str:
    """Continue `prompt` by `n_bytes` tokens drawn one at a time (temperature 0: always the
    most likely byte). Returns the continuation only, decoded as UTF-8."""
    if not isinstance(n_bytes, int) or n_bytes < 0:
        raise SmallemError(f"the number of bytes to sample must be 0 or more, got {n_bytes!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise SmallemError(f"the temperature must be 0 or more, got {temperature!r}")
    if not isinstance(seed, int) or seed < 0:
        raise SmallemError(f"the seed must be a whole number, 0 or more, got {seed!r}")
    backend = model_backend(model)
    context = getattr(getattr(model, "config", None), "context", CONTEXT)
    # The prompt starts a new document. In training, a document's first bytes were predicted
    # from the end of the previous one (ending in a newline) and the boundary token: pad with
    # that. Sixteen boundary tokens in a row never occur, and give garbage.
    tokens = [10] * (context - 1) + [BOUNDARY] + encode(prompt).tolist()
    rng = np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(n_bytes):
        tape = Tape(backend)
        logits = model.logits(tape, np.array([tokens[-context:]], dtype=np.int64))
        tape.close()
        z = np.asarray(backend.to_numpy(logits.value), dtype=np.float64)[0]
        if temperature == 0:
            token = int(np.argmax(z))
        else:
            p = np.exp((z - z.max()) / temperature)
            token = int(rng.choice(p.size, p=p / p.sum()))
        tokens.append(token)
        out.append(token)
    return decode(out)


# the loop --------------------------------------------------------------------------------
@dataclass
class TrainResult:
    config: TrainConfig
    backend: str
    steps: int
    wall_seconds: float  # this session's loop, evaluations included
    steps_per_second: float  # this session's training steps over their time, evaluations excluded
    initial_loss: float  # the loss of the first step, before any update
    final_train_loss: float  # mean over the last log interval
    held_out_loss: float
    bigram_held_out_loss: float  # the closed-form bigram on the same held-out batches
    history: list[dict[str, Any]]  # {"step", "train_loss", "held_out_loss", "seconds"}
    model: Module = field(repr=False)
    optimizer: Optimizer = field(repr=False)
    corpus: Corpus = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        skip = {"model", "optimizer", "corpus"}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        out["config"] = asdict(self.config)
        out["corpus"] = self.corpus.fingerprint()
        out["parameters"] = self.model.parameter_count()
        return out

    def curves(self) -> dict[str, np.ndarray]:
        """The history as arrays for plotting; NaN where a value was not measured."""
        return {key: np.array([np.nan if r[key] is None else r[key] for r in self.history],
                              dtype=np.float64)
                for key in ("step", "train_loss", "held_out_loss")}


def config_from(checkpoint: Checkpoint) -> TrainConfig:
    """The TrainConfig a checkpoint was trained with."""
    known = {f.name for f in fields(TrainConfig)}
    try:
        return TrainConfig(**{k: v for k, v in checkpoint.config.items() if k in known}).validate()
    except TypeError:
        raise SmallemError("the checkpoint's config cannot be read: it was written by another "
                           "version of smallem") from None


def _resolve_resume(config: TrainConfig, checkpoint: Checkpoint) -> None:
    saved = config_from(checkpoint)
    for name in TrainConfig.RUN_FIELDS:
        if getattr(saved, name) != getattr(config, name):
            raise SmallemError(f"{name} is {getattr(config, name)!r} but the checkpoint was "
                               f"trained with {getattr(saved, name)!r}: resume with the same "
                               f"{name} (leave it out on the command line)")
    if checkpoint.step > config.steps:
        raise SmallemError(f"the checkpoint is at step {checkpoint.step}, past --steps "
                           f"{config.steps}: ask for more steps than that to continue")


class _Interrupt:
    requested = False


@contextmanager
def _deferred_interrupt() -> Iterator[_Interrupt]:
    """Ctrl-C stops the loop between two steps, never inside an update, so the checkpoint
    saved then is exact. A second Ctrl-C stops at once."""
    flag = _Interrupt()

    def handler(signum: int, frame: Any) -> None:
        if flag.requested:
            raise KeyboardInterrupt
        flag.requested = True

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: leave Ctrl-C as it is
        previous = None
    try:
        yield flag
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _restore(checkpoint: Checkpoint, corpus: Corpus, model: Module, optimizer: Optimizer,
             sampler: BatchSampler) -> tuple[int, list[dict[str, Any]], float | None, list]:
    """Put a run back as the checkpoint left it: (step, history, initial loss, interval)."""
    meta = checkpoint.meta
    missing = [k for k in ("sampler", "history", "initial_loss", "interval", "corpus")
               if k not in meta]
    if missing or checkpoint.optimizer is None:
        raise SmallemError(f"checkpoint {checkpoint.path!r} holds no training state "
                           f"({(missing or ['optimizer'])[0]}): it can be sampled from, not resumed")
    same = {k: v for k, v in corpus.fingerprint().items() if k != "source"}
    if {k: v for k, v in meta["corpus"].items() if k != "source"} != same:
        raise SmallemError(f"the corpus differs from the one checkpoint {checkpoint.path!r} was "
                           f"trained on ({meta['corpus'].get('source')}): resume on the same text")
    load_parameters(model, checkpoint.parameters, checkpoint.path)
    optimizer.load_state_dict(model.named_parameters(), checkpoint.optimizer)
    sampler.load_state(meta["sampler"])
    return checkpoint.step, list(meta["history"]), meta["initial_loss"], meta["interval"]


def train(config: TrainConfig | None = None, *, corpus: Corpus | None = None,
          resume: str | Path | Checkpoint | None = None, save: str | Path | None = None,
          callbacks: Sequence[Callable[[dict[str, Any]], Any]] = (), progress: bool = True,
          log: Callable[[str], Any] | None = print) -> TrainResult:
    """Train a model as `config` says and return its history.

    `callbacks` receive each history record as it is made (a notebook can plot live);
    `progress` shows a tqdm bar; `log` receives the log lines (None: silent). With `save`,
    a checkpoint is written every `config.save_every` steps, at the end, and on Ctrl-C;
    `resume` continues one exactly: same batches, same losses."""
    config = (config or TrainConfig()).validate()
    checkpoint = load_checkpoint(resume) if isinstance(resume, (str, Path)) else resume
    if checkpoint is not None:
        _resolve_resume(config, checkpoint)
    backend = get_backend(config.backend)
    corpus = corpus or load_corpus(config.corpus)
    model = build_model(config, backend)
    optimizer = make_optimizer(config.optimizer, config.lr, config.weight_decay, config.clip)
    context = config.mlp.context
    sampler = BatchSampler(corpus.train, config.batch, context, seed=[config.seed, 1])
    held_out = fixed_batches(corpus.held_out, EVAL_BATCH, config.eval_batches, context)
    bigram_loss = evaluate(Bigram.fit(corpus.train, config.mlp.vocab, backend=backend), held_out)

    if checkpoint is not None:
        step, history, initial_loss, interval = _restore(checkpoint, corpus, model, optimizer,
                                                         sampler)
    else:
        step, history, initial_loss, interval = 0, [], None, [0.0, 0]
        history.append({"step": 0, "train_loss": None, "held_out_loss": evaluate(model, held_out),
                        "seconds": 0.0})
    # The sum of this log interval's losses stays on the device: adding is free, reading syncs.
    running, count = backend.tensor(interval[0]), int(interval[1])

    def checkpoint_to(path: str | Path) -> None:
        meta = {"step": step, "config": asdict(config), "sampler": sampler.state(),
                "corpus": corpus.fingerprint(), "history": history, "initial_loss": initial_loss,
                "interval": [backend.item(running), count], "backend": backend.name}
        save_checkpoint(path, model, optimizer, meta)

    def log_point(step: int, rate: float) -> None:
        nonlocal running, count
        train_loss = backend.item(running) / count  # the one read of the interval
        running, count = backend.zeros(()), 0
        held = None
        if step % config.eval_every == 0 or step == config.steps:
            held = evaluate(model, held_out)
        record = {"step": step, "train_loss": train_loss, "held_out_loss": held,
                  "seconds": offset + time.perf_counter() - start}
        history.append(record)
        if say is not None:
            say(f"step {step:>6}/{config.steps}  train {train_loss:.4f}"
                + (f"  held-out {held:.4f}" if held is not None else "") + f"  {rate:.1f} steps/s")
        for callback in callbacks:
            callback(record)

    from tqdm.auto import tqdm

    bar = tqdm(total=config.steps, initial=step, disable=not progress, unit="step",
               dynamic_ncols=True)
    say = bar.write if progress and log is print else log
    offset = history[-1]["seconds"]
    start = time.perf_counter()
    first_step, last_step, last_time, log_seconds = step, step, start, 0.0
    try:
        with _deferred_interrupt() as interrupt:
            while step < config.steps and not interrupt.requested:
                contexts, targets = sampler.next()
                loss = train_step(backend, model, optimizer,
                                  lambda tape: model.loss(tape, contexts, targets))
                step += 1
                if initial_loss is None:
                    initial_loss = backend.item(loss)
                running, count = backend.add(running, loss), count + 1
                bar.update(1)
                if (step % config.log_every == 0 or step % config.eval_every == 0
                        or step == config.steps):
                    now = time.perf_counter()
                    log_point(step, (step - last_step) / max(now - last_time, 1e-9))
                    last_step, last_time = step, time.perf_counter()
                    log_seconds += last_time - now  # evaluations are not training time
                if save is not None and config.save_every and step % config.save_every == 0:
                    checkpoint_to(save)
        if interrupt.requested:  # stopped between two steps: the state is whole, save it
            if save is not None:
                checkpoint_to(save)
                if log is not None:
                    log(f"interrupted at step {step}: checkpoint saved to {save}; continue "
                        f"with --resume {save}")
            raise KeyboardInterrupt
    finally:
        bar.close()
    wall = time.perf_counter() - start
    if save is not None:
        checkpoint_to(save)
    done = step - first_step
    evaluated = [r for r in history if r["held_out_loss"] is not None]
    trained = [r for r in history if r["train_loss"] is not None]
    return TrainResult(
        config=config, backend=backend.name, steps=step, wall_seconds=wall,
        steps_per_second=done / max(wall - log_seconds, 1e-9) if done else 0.0,
        initial_loss=initial_loss if initial_loss is not None else math.nan,
        final_train_loss=trained[-1]["train_loss"] if trained else math.nan,
        held_out_loss=evaluated[-1]["held_out_loss"], bigram_held_out_loss=bigram_loss,
        history=history, model=model, optimizer=optimizer, corpus=corpus)


def load_model(path: str | Path, backend: Backend | str = "cpu") -> tuple[Module, Checkpoint]:
    """The model stored in a checkpoint, on `backend`, ready to sample from."""
    checkpoint = load_checkpoint(path)
    model = build_model(config_from(checkpoint), get_backend(backend))
    load_parameters(model, checkpoint.parameters, str(path))
    return model, checkpoint

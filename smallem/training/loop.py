"""Training: evaluation and the loop.

`train(config)` is the loop behind `smallem train` and the notebooks: a progress bar, a log
line every few steps, held-out evaluations on fixed batches, checkpoints, and a history. What
a run is lives in config.py, one step (plain or captured on a GPU) in step.py, generation in
sample.py.
"""

from __future__ import annotations

import math
import signal
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ..autodiff.tape import Tape
from ..backends import get_backend
from ..data import BatchSampler, Corpus, fixed_batches, load_corpus
from ..errors import SmallemError, SmallemWarning
from ..models.bigram import Bigram
from ..nn import Module
from ..optim import Optimizer, make_optimizer
from .checkpoint import Checkpoint, load_checkpoint, load_parameters, non_finite, save_checkpoint
from .config import BATCH, TrainConfig, build_model, config_from
from .generate import model_backend
from .paths import save_or_rescue
from .step import Observer, make_step

EVAL_BATCH = BATCH  # held-out examples per evaluation batch, whatever the training batch


def evaluate(model: Module, batches: Sequence[tuple[np.ndarray, np.ndarray]]) -> float:
    """Mean loss over `batches` (no gradients), read from the device once."""
    backend = model_backend(model)
    total = backend.zeros(())
    for contexts, targets in batches:
        tape = Tape(backend)
        total = backend.add(total, tape.value(model.loss(tape, contexts, targets)))
        tape.close()  # never differentiated: done with, parameters may change
    return backend.item(total) / len(batches)


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
    checkpoint: str | None = None  # where the last checkpoint went (a rescue place if need be)
    diverged_at: int | None = None  # the step whose loss was NaN or infinite; the run stopped

    def to_json(self) -> dict[str, Any]:
        skip = {"model", "optimizer", "corpus"}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        out["config"] = self.config.to_json()
        out["corpus"] = self.corpus.fingerprint()
        out["parameters"] = self.model.parameter_count()
        return out

    def curves(self) -> dict[str, np.ndarray]:
        """The history as arrays for plotting; NaN where a value was not measured."""
        return {key: np.array([np.nan if r[key] is None else r[key] for r in self.history],
                              dtype=np.float64)
                for key in ("step", "train_loss", "held_out_loss")}


def _check_resume(config: TrainConfig, checkpoint: Checkpoint) -> None:
    saved = config_from(checkpoint.config)
    for name in TrainConfig.RUN_FIELDS:
        attribute = "learning_rate" if name == "lr" else name  # a default lr is a value too
        if getattr(saved, attribute) != getattr(config, attribute):
            raise SmallemError(f"{name} is {getattr(config, attribute)!r} but the checkpoint was "
                               f"trained with {getattr(saved, attribute)!r}: resume with the "
                               f"same {name} (leave it out on the command line)")
    if checkpoint.step > config.steps:
        raise SmallemError(f"the checkpoint is at step {checkpoint.step}, past --steps "
                           f"{config.steps}: ask for more steps than that to continue")


class Interrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C (SIGINT) or SIGTERM between two steps; the message says what
    was saved. `signum` gives the command line its exit status (128 + signum)."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.signum = signum


class _Interrupt:
    requested = False
    signum = signal.SIGINT


@contextmanager
def _deferred_interrupt() -> Iterator[_Interrupt]:
    """Ctrl-C, and SIGTERM (what `kill`, Docker and Slurm send), stop the loop between two
    steps, never inside an update, so the checkpoint saved then is exact. A second one stops
    at once."""
    flag = _Interrupt()

    def handler(signum: int, frame: Any) -> None:
        if flag.requested:
            raise Interrupted(f"stopped by {signal.Signals(signum).name} a second time, at "
                              "once", signum)
        flag.requested, flag.signum = True, signum

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[signum] = signal.signal(signum, handler)
        except ValueError:  # not the main thread: leave the signals as they are
            pass
    try:
        yield flag
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


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


class _Progress:
    """The loop's clock and voice: a tqdm bar, log lines, and the time spent evaluating (which
    is not training time, so steps/s leaves it out)."""

    def __init__(self, config: TrainConfig, step: int, offset: float, show: bool,
                 log: Callable[[str], Any] | None) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=config.steps, initial=step, disable=not show, unit="step",
                        dynamic_ncols=True)
        self.say = self.bar.write if show and log is print else log
        self.offset = offset  # seconds of the run before this session (a resumed run)
        self.start = self.last_time = time.perf_counter()
        self.first_step = self.last_step = step
        self.evaluating = 0.0

    def seconds(self) -> float:
        """Seconds since the run began, sessions before this one included."""
        return self.offset + time.perf_counter() - self.start

    def rate(self, step: int) -> float:
        """Steps per second since the last log line."""
        return (step - self.last_step) / max(time.perf_counter() - self.last_time, 1e-9)

    def logged(self, step: int, began: float) -> None:
        """A log point that began at `began` is over: its time was not training."""
        self.last_step, self.last_time = step, time.perf_counter()
        self.evaluating += self.last_time - began

    def steps_per_second(self, step: int) -> float:
        done = step - self.first_step
        return done / max(time.perf_counter() - self.start - self.evaluating, 1e-9) if done else 0.0


def train(config: TrainConfig | None = None, *, corpus: Corpus | None = None,
          resume: str | Path | Checkpoint | None = None, save: str | Path | None = None,
          callbacks: Sequence[Callable[[dict[str, Any]], Any]] = (), progress: bool = True,
          log: Callable[[str], Any] | None = print, observer: Observer | None = None
          ) -> TrainResult:
    """Train a model as `config` says and return its history.

    `callbacks` receive each history record as it is made (a notebook can plot live);
    `progress` shows a tqdm bar; `log` receives the log lines (None: silent); `observer` looks
    inside the steps it wants (health.py). With `save`, a checkpoint is written every
    `config.save_every` steps, at the end, and on Ctrl-C or SIGTERM (which stop between two
    steps and raise Interrupted); a save that fails goes to a rescue file instead, with a
    SmallemWarning saying where, and training goes on. A loss that turns NaN or infinite stops
    the run with a SmallemWarning, and such weights are never saved. `resume` continues a
    checkpoint exactly."""
    config = config or TrainConfig()
    optimizer = make_optimizer(config.optimizer, config.learning_rate, config.weight_decay,
                               config.clip, model=config.model)  # checks lr, decay, clip
    checkpoint = load_checkpoint(resume) if isinstance(resume, (str, Path)) else resume
    if checkpoint is not None:
        _check_resume(config, checkpoint)
    backend = get_backend(config.backend)
    corpus = corpus or load_corpus(config.corpus)
    model = build_model(config, backend)
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
    listeners = list(callbacks) + ([observer.on_record] if observer is not None else [])

    def checkpoint_to(path: str | Path) -> None:
        meta = {"step": step, "config": config.to_json(), "sampler": sampler.state(),
                "corpus": corpus.fingerprint(), "history": history, "initial_loss": initial_loss,
                "interval": [backend.item(running), count], "backend": backend.name}
        save_checkpoint(path, model, optimizer, meta)

    saved_to: str | None = None
    diverged_at: int | None = None

    def keep(final: bool) -> None:
        """Save to `save`; when that fails, to a rescue place, and say where: a run is never
        lost to a full disk or a folder gone. Weights that are not finite are never saved."""
        nonlocal saved_to, diverged_at
        if non_finite(dict(model.named_parameters())) is not None:
            diverged_at = diverged_at or step
            return
        where, problem = save_or_rescue(save, checkpoint_to)
        if where is not None:
            saved_to = str(where)
        if problem is None:
            return
        then = (f"; continue with --resume {where}" if final else
                f"; training goes on, and the next save tries {str(save)!r} again")
        lost = ("; the trained weights are lost when this process ends" if final
                else "; training goes on")
        warnings.warn(f"could not save the checkpoint of step {step}: {problem}; "
                      + (f"saved it to {where} instead{then}" if where is not None
                         else f"no other place could be written either{lost}"),
                      SmallemWarning, stacklevel=3)

    take_step = make_step(backend, model, optimizer, capture=config.capture)
    clock = _Progress(config, step, history[-1]["seconds"], progress, log)
    try:
        with _deferred_interrupt() as interrupt:
            while step < config.steps and not interrupt.requested and diverged_at is None:
                contexts, targets = sampler.next()
                watch = observer if observer is not None and observer.wants(step + 1) else None
                loss = take_step(contexts, targets, observer=watch)
                step += 1
                if initial_loss is None:
                    initial_loss = backend.item(loss)
                running, count = backend.add(running, loss), count + 1
                clock.bar.update(1)
                if (step % config.log_every == 0 or step % config.eval_every == 0
                        or step == config.steps):
                    began, rate = time.perf_counter(), clock.rate(step)
                    train_loss = backend.item(running) / count  # the one read of the interval
                    running, count = backend.zeros(()), 0
                    held = (evaluate(model, held_out) if step % config.eval_every == 0
                            or step == config.steps else None)
                    record = {"step": step, "train_loss": train_loss, "held_out_loss": held,
                              "seconds": clock.seconds()}
                    history.append(record)
                    if not math.isfinite(train_loss + (held or 0.0)):
                        diverged_at = step  # NaN or infinite: nothing left to learn, stop
                    if clock.say is not None:
                        clock.say(f"step {step:>6}/{config.steps}  train {train_loss:.4f}"
                                  + (f"  held-out {held:.4f}" if held is not None else "")
                                  + f"  {rate:.1f} steps/s")
                    for listener in listeners:
                        listener(record)
                    clock.logged(step, began)
                if save is not None and config.save_every and step % config.save_every == 0:
                    keep(final=False)
        if interrupt.requested:  # stopped between two steps: the state is whole, save it
            if save is not None:
                keep(final=True)
            message = (f"stopped by {signal.Signals(interrupt.signum).name} at step {step}: " + (
                f"checkpoint saved to {saved_to}; continue with --resume {saved_to}"
                if saved_to else "nothing saved (pass --save FILE to keep an interrupted run)"))
            if log is not None:
                log(message)
            raise Interrupted(message, interrupt.signum)
    finally:
        clock.bar.close()
    wall = time.perf_counter() - clock.start
    if save is not None and diverged_at is None:
        keep(final=True)
    if diverged_at is not None:
        warnings.warn(
            f"training diverged: the loss is not a finite number at step {diverged_at}, so the "
            "run stopped there" + (f" and nothing was saved over {str(save)!r}" if save else "")
            + f"; lower --lr (it is {config.learning_rate:g})"
            + ("" if config.clip else " or clip the gradients with --clip 1"),
            SmallemWarning, stacklevel=2)
    evaluated = [r for r in history if r["held_out_loss"] is not None]
    trained = [r for r in history if r["train_loss"] is not None]
    return TrainResult(
        config=config, backend=backend.name, steps=step, wall_seconds=wall,
        steps_per_second=clock.steps_per_second(step),
        initial_loss=initial_loss if initial_loss is not None else math.nan,
        final_train_loss=trained[-1]["train_loss"] if trained else math.nan,
        held_out_loss=evaluated[-1]["held_out_loss"], bigram_held_out_loss=bigram_loss,
        history=history, model=model, optimizer=optimizer, corpus=corpus, checkpoint=saved_to,
        diverged_at=diverged_at)

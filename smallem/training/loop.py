"""Training: the loop.

`train(config)` is the loop behind `smallem train` and the notebooks: a progress bar, a log
line every few steps, held-out evaluations on fixed batches (evaluation.py), checkpoints, a
clean stop on Ctrl-C (signals.py), and a history. What a run is lives in config.py (its model in
registry.py), one step (plain or captured on a GPU) in step.py, generation in generate.py.
"""

from __future__ import annotations

import math
import signal
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from .. import ranks
from ..backends import Backend, get_backend
from ..backends.precision import LossScaler
from ..data import BatchSampler, Corpus, SequenceSampler
from ..errors import SmallemError, SmallemWarning
from ..files import save_or_rescue
from ..models.protocol import LanguageModel
from ..optim import Optimizer, make_optimizer
from ..ranks import World
from .bar import Clock, progress_bar, terminal_only
from .checkpoint import Checkpoint, load_checkpoint, load_parameters, non_finite, save_checkpoint
from .config import TrainConfig, build_model
from .evaluation import bigram_baseline, evaluate, held_out_batches, periodic_batches, spread
from .ranked import RankedStep, check_same_run
from .signals import Interrupt, Interrupted, deferred_interrupt
from .step import Observer, Step, make_step
from .tokenized import checkpoint_meta, held_out_score, prepare


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
    model: LanguageModel = field(repr=False)
    optimizer: Optimizer = field(repr=False)
    corpus: Corpus = field(repr=False)
    checkpoint: str | None = None  # where the last checkpoint went (a rescue place if need be)
    diverged_at: int | None = None  # the step whose loss was NaN or infinite; the run stopped
    # A Transformer's mean loss over every position of the held-out windows, at the end (its
    # held_out_loss scores the last position only: the MLP's targets)
    held_out_every_position: float | None = None
    bits_per_byte: dict[str, Any] | None = None  # bpb.py's Score on the same held-out bytes, at the end
    ranks: int = 1  # processes that trained it, each on its rows of every batch (smallem.ranks)

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
    config.check_same_run(checkpoint.train_config())
    if checkpoint.step > config.steps:
        raise SmallemError(f"the checkpoint is at step {checkpoint.step}, past --steps "
                           f"{config.steps}: ask for more steps than that to continue")


def batch_sampler(config: TrainConfig, corpus: Corpus) -> BatchSampler:
    """Training batches, as the model reads (registry.py): (B, T) windows and (B,) next bytes
    (the MLP, the bigram); or (B, T) sequences and their (B, T) next bytes (the Transformer)."""
    kind = SequenceSampler if config.sequences else BatchSampler
    return kind(corpus.train, config.batch, config.sizes.context, seed=[config.seed, 1])


class _Run:
    """One training run's state, which the loop in `train` advances step by step: the model,
    its optimizer and batches, the step reached, the history, the log interval's running loss,
    and where it was saved. Each method is one thing the loop does."""

    def __init__(self, config: TrainConfig, corpus: Corpus, backend: Backend,
                 optimizer: Optimizer, save: str | Path | None, world: World, show: bool) -> None:
        self.config, self.corpus, self.backend, self.optimizer = config, corpus, backend, optimizer
        self.save, self.world = save, world  # a save is rank 0's alone (None on the others)
        self.show = show  # bars for the evaluations that take long: before step 1, at the end
        self.model = build_model(config, backend)
        self.sampler = batch_sampler(config, corpus)
        self.held_out = held_out_batches(config, corpus)  # the final evaluation's
        self.periodic = spread(self.held_out, periodic_batches(config))  # step 0's, every eval_every
        self.bigram_loss = bigram_baseline(config, corpus, backend)  # the same targets
        self.step, self.history = 0, []
        self.initial_loss: float | None = None
        self.running, self.count = backend.zeros(()), 0  # this log interval's summed losses
        self.saved_to: str | None = None
        self.diverged_at: int | None = None

    def begin(self, checkpoint: Checkpoint | None) -> None:
        """Continue `checkpoint` exactly, or start: the held-out loss before any step."""
        if checkpoint is None:
            with self.scoring("held-out loss before step 1", self.periodic) as bar:
                held = evaluate(self.model, self.periodic, self.world, bar)
            self.history.append({"step": 0, "train_loss": None, "seconds": 0.0,
                                 "held_out_loss": held})
            return
        meta = checkpoint.meta
        missing = [k for k in ("sampler", "history", "initial_loss", "interval", "corpus")
                   if k not in meta]
        if missing or checkpoint.optimizer is None:
            raise SmallemError(f"checkpoint {checkpoint.path!r} holds no training state "
                               f"({(missing or ['optimizer'])[0]}): it can be sampled from, not "
                               "resumed")
        same = {k: v for k, v in self.corpus.fingerprint().items() if k != "source"}
        if {k: v for k, v in meta["corpus"].items() if k != "source"} != same:
            raise SmallemError(f"the corpus differs from the one checkpoint {checkpoint.path!r} "
                               f"was trained on ({meta['corpus'].get('source')}): resume on the "
                               "same text")
        load_parameters(self.model, checkpoint.parameters, checkpoint.path)
        self.optimizer.load_state_dict(self.model.named_parameters(), checkpoint.optimizer)
        self.sampler.load_state(meta["sampler"])
        self.step, self.history = checkpoint.step, list(meta["history"])
        self.initial_loss = meta["initial_loss"]
        # The sum of this log interval's losses stays on the device: adding is free, reading syncs.
        self.running, self.count = self.backend.tensor(meta["interval"][0]), int(meta["interval"][1])

    def running_out(self, interrupt: Interrupt) -> bool:
        return (self.step >= self.config.steps or interrupt.requested
                or self.diverged_at is not None)

    def advance(self, take_step: Step, observer: Observer | None) -> None:
        """One training step on the next batch; its loss joins the interval's sum, unread."""
        inputs, targets = self.sampler.next()
        watch = observer if observer is not None and observer.wants(self.step + 1) else None
        loss = take_step(inputs, targets, observer=watch)
        self.step += 1
        if self.initial_loss is None:
            self.initial_loss = self.backend.item(loss)
        self.running, self.count = self.backend.add(self.running, loss), self.count + 1

    def at_log_point(self) -> bool:
        c, step = self.config, self.step
        return step % c.log_every == 0 or step % c.eval_every == 0 or step == c.steps

    def log_point(self, clock: Clock, listeners: Sequence[Callable[[dict], Any]]) -> None:
        """Read the interval's mean loss, evaluate when it is time, record, say it, and stop
        the run if the loss is no longer a number."""
        began, rate, step = time.perf_counter(), clock.rate(self.step), self.step
        train_loss = self.backend.item(self.running) / self.count  # the one read of the interval
        self.running, self.count = self.backend.zeros(()), 0
        held = None
        if step == self.config.steps:  # the run's score: every held-out target
            with self.scoring(f"held-out loss, {self.targets():,} targets", self.held_out) as bar:
                held = evaluate(self.model, self.held_out, self.world, bar)
        elif step % self.config.eval_every == 0:
            held = evaluate(self.model, self.periodic, self.world)
        record = {"step": step, "train_loss": train_loss, "held_out_loss": held,
                  "seconds": clock.seconds()}
        self.history.append(record)
        if not math.isfinite(train_loss + (held or 0.0)):
            self.diverged_at = step  # NaN or infinite: nothing left to learn, stop
        if clock.say is not None:
            clock.say(f"step {step:>6}/{self.config.steps}  train {train_loss:.4f}"
                      + (f"  held-out {held:.4f}" if held is not None else "")
                      + f"  {rate:.1f} steps/s")
        for listener in listeners:
            listener(record)
        clock.logged(step, began)

    def targets(self) -> int:
        return sum(len(targets) for _, targets in self.held_out)

    def scoring(self, what: str, batches: Sequence) -> Any:
        """A bar that says what is being evaluated, gone once done (shown by rank 0 when the
        run shows progress): a CPU Transformer's evaluation takes as long as many steps."""
        share = len(batches[self.world.rank::self.world.size])
        return progress_bar(total=share, desc=what, unit="batch", leave=False,
                            disable=not self.show or not terminal_only(), dynamic_ncols=True)

    def at_save_point(self) -> bool:
        every = self.config.save_every
        return self.save is not None and bool(every) and self.step % every == 0

    def write_checkpoint(self, path: str | Path) -> None:
        meta = {"step": self.step, "config": self.config.to_json(),
                "sampler": self.sampler.state(), "corpus": self.corpus.fingerprint(),
                "history": self.history, "initial_loss": self.initial_loss,
                "interval": [self.backend.item(self.running), self.count],
                "backend": self.backend.name, **checkpoint_meta(self.corpus)}
        save_checkpoint(path, self.model, self.optimizer, meta)

    def keep(self, final: bool) -> None:
        """Save to `save`; when that fails, to a rescue place, and say where: a run is never
        lost to a full disk or a folder gone. Weights that are not finite are never saved."""
        if non_finite(dict(self.model.named_parameters())) is not None:
            self.diverged_at = self.diverged_at or self.step
            return
        where, problem = save_or_rescue(self.save, self.write_checkpoint)
        if where is not None:
            self.saved_to = str(where)
        if problem is None:
            return
        then = (f"; continue with --resume {where}" if final else
                f"; training goes on, and the next save tries {str(self.save)!r} again")
        lost = ("; the trained weights are lost when this process ends" if final
                else "; training goes on")
        warnings.warn(f"could not save the checkpoint of step {self.step}: {problem}; "
                      + (f"saved it to {where} instead{then}" if where is not None
                         else f"no other place could be written either{lost}"),
                      SmallemWarning, stacklevel=3)

    def stop(self, signum: int) -> None:
        """Stopped between two steps by a signal: the state is whole, save it and say so, once:
        in the exception (the command line prints it, a notebook shows it)."""
        if self.save is not None:
            self.keep(final=True)
        message = (f"stopped by {signal.Signals(signum).name} at step {self.step}: " + (
            f"checkpoint saved to {self.saved_to}; continue with --resume {self.saved_to}"
            if self.saved_to else "nothing saved (pass --save FILE to keep an interrupted run)"))
        raise Interrupted(message, signum)

    def warn_diverged(self) -> None:
        warnings.warn(
            f"training diverged: the loss is not a finite number at step {self.diverged_at}, so "
            "the run stopped there"
            + (f" and nothing was saved over {str(self.save)!r}" if self.save else "")
            + f"; lower --lr (it is {self.config.learning_rate:g})"
            + ("" if self.config.clip else " or clip the gradients with --clip 1"),
            SmallemWarning, stacklevel=3)

    def result(self, rate: float, wall: float) -> TrainResult:
        evaluated = [r for r in self.history if r["held_out_loss"] is not None]
        trained = [r for r in self.history if r["train_loss"] is not None]
        every_position = None
        score = None  # rank 0 scores the bytes, and tells the others
        if self.diverged_at is None:
            with self.scoring("bits per byte", [None]) as bar:
                score = self.world.bcast(held_out_score(self.model, self.corpus).to_json()
                                         if self.world.rank == 0 else None)
                bar.update(1)
        if self.config.sequences and self.diverged_at is None:  # the same windows, every byte
            every = held_out_batches(self.config, self.corpus, False)
            with self.scoring("held-out loss at every position", every) as bar:
                every_position = evaluate(self.model, every, self.world, bar)
        return TrainResult(
            config=self.config, backend=self.backend.name, steps=self.step, wall_seconds=wall,
            steps_per_second=rate,
            initial_loss=self.initial_loss if self.initial_loss is not None else math.nan,
            final_train_loss=trained[-1]["train_loss"] if trained else math.nan,
            held_out_loss=evaluated[-1]["held_out_loss"], bigram_held_out_loss=self.bigram_loss,
            history=self.history, model=self.model, optimizer=self.optimizer, corpus=self.corpus,
            checkpoint=self.saved_to, diverged_at=self.diverged_at,
            held_out_every_position=every_position, bits_per_byte=score, ranks=self.world.size)


def _on_gpus(world: World, backend: str) -> World:
    """Rank r on GPU r (modulo the GPUs here) with NCCL between them; `auto` on a machine
    without a GPU stays on the host."""
    from ..ranks.nccl import NcclWorld, use_device

    try:
        use_device(world)
    except SmallemError:
        raise
    except Exception:  # no CuPy, no device: `auto` trains on the CPU, `gpu` says why
        if backend == "gpu":
            get_backend("gpu")
            raise
        return world
    return NcclWorld(world)


def train(config: TrainConfig | None = None, *, corpus: Corpus | None = None,
          resume: str | Path | Checkpoint | None = None, save: str | Path | None = None,
          callbacks: Sequence[Callable[[dict[str, Any]], Any]] = (), progress: bool = True,
          log: Callable[[str], Any] | None = print, observer: Observer | None = None,
          loss_scaler: LossScaler | None | str = "auto", world: World | None = None
          ) -> TrainResult:
    """Train a model as `config` says and return its history.

    `callbacks` receive each history record as it is made (a notebook can plot live);
    `progress` shows a tqdm bar; `log` receives the log lines (None: silent); `observer` looks
    inside the steps it wants (training/health.py). With `save`, a checkpoint is written every
    `config.save_every` steps, at the end, and on Ctrl-C or SIGTERM (which stop between two
    steps and raise Interrupted); a save that fails goes to a rescue file instead, with a
    SmallemWarning saying where, and training goes on. A loss that turns NaN or infinite stops
    the run with a SmallemWarning, and such weights are never saved. `resume` continues a
    checkpoint exactly. `loss_scaler`: "auto" gives an fp16 run a LossScaler and other precisions
    none; None runs without one (lesson 14 shows fp16 stalling so); or a scaler of one's own.
    `world` (left out: smallem.ranks.world(), the ranks mpiexec started, else one process):
    each rank trains on its rows of every batch (training/ranked.py); rank 0 alone shows
    progress, logs and saves; every rank returns the same result."""
    config = config or TrainConfig()
    optimizer = make_optimizer(config.optimizer, config.learning_rate, config.weight_decay,
                               config.clip)  # checks lr, decay, clip
    checkpoint = load_checkpoint(resume) if isinstance(resume, (str, Path)) else resume
    if checkpoint is not None:
        _check_resume(config, checkpoint)
    world = world or ranks.world()
    if world.rank != 0:  # one voice, one writer
        progress, log, save = False, None, None
    if world.size > 1 and config.backend in ("gpu", "auto"):
        world = _on_gpus(world, config.backend)  # one GPU per rank, before the backend starts
    backend = get_backend(config.backend, config.precision)  # the model, its steps, its evaluation
    if backend.name == "gpu" and (world.size > 1 or config.accumulate > 1):
        from ..ranks.nccl import NcclWorld

        world = world if isinstance(world, NcclWorld) else NcclWorld(world)
    corpus = prepare(config, corpus, checkpoint, log)  # bytes or ids
    if world.size > 1 or config.accumulate > 1:
        check_same_run(world, {**config.to_json(), **{
            f"the corpus's {k}": v for k, v in corpus.fingerprint().items() if k != "source"}},
            config.batch, config.accumulate)
    run = _Run(config, corpus, backend, optimizer, save, world, progress)
    run.begin(checkpoint)
    listeners = list(callbacks) + ([observer.on_record] if observer is not None else [])
    if observer is not None:
        observer.on_history(run.history)  # the records before this session's first step
    scaler = loss_scaler if loss_scaler != "auto" else (  # bf16 has float32's range: no scaler
        LossScaler() if config.precision == "fp16" else None)
    take_step = (make_step(backend, run.model, optimizer, capture=config.capture, scaler=scaler)
                 if world.size == 1 and config.accumulate == 1 else
                 RankedStep(backend, run.model, optimizer, world, accumulate=config.accumulate,
                            scaler=scaler, capture=config.capture))
    clock = Clock(config, run.step, run.history[-1]["seconds"], progress, log)
    try:
        with deferred_interrupt() as asked:
            interrupt = asked  # a rank stops when every rank has heard of it (in the step's sum)
            if isinstance(take_step, RankedStep):
                take_step.interrupt, interrupt = asked, take_step.agreed
            while not run.running_out(interrupt):
                run.advance(take_step, observer)
                clock.bar.update(1)
                if run.at_log_point():
                    run.log_point(clock, listeners)
                if run.at_save_point():
                    run.keep(final=False)
        if interrupt.requested:
            run.stop(interrupt.signum)  # raises Interrupted, having saved
    finally:
        clock.bar.close()
    wall = time.perf_counter() - clock.start
    rate = clock.steps_per_second(run.step)  # now: the final save and evaluation are not steps
    if save is not None and run.diverged_at is None:
        run.keep(final=True)
    if run.diverged_at is not None:
        run.warn_diverged()
    return run.result(rate, wall)

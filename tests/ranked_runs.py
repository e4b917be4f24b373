"""What tests/test_ranks.py runs on real ranks (`smallem.ranks.run` starts them with mpiexec and
imports this module by name): small cpu64 runs whose results the test compares with one process."""

import os
import signal

import numpy as np

from smallem.data import load_corpus
from smallem.models.mlp import MlpConfig
from smallem.ranks import MpiWorld, buckets
from smallem.training.config import TrainConfig
from smallem.training.loop import train
from smallem.training.signals import Interrupted

TINY = MlpConfig(context=4, embed=3, hidden=16)
CORPUS_BYTES = 60_000


def tiny(**overrides):
    base = dict(backend="cpu64", steps=100, batch=7, log_every=25, eval_every=50, eval_batches=1,
                save_every=0, sizes=TINY)
    return TrainConfig(**{**base, **overrides})


def outcome(result):
    """What two runs must share: the parameters, the losses, the held-out numbers."""
    return {"parameters": {n: p.value.copy() for n, p in result.model.named_parameters()},
            "losses": [r["train_loss"] for r in result.history],
            "held_out": [r["held_out_loss"] for r in result.history],
            "bits_per_byte": result.bits_per_byte}


def trajectories(world, sizes, overrides, bucket_bytes=1024):
    """For each N in `sizes`: the first N ranks train together (an MPI communicator of their
    own), the others wait; one outcome per N, from rank 0. Buckets of 1 KiB: the tiny model's
    gradients go in a dozen all-reduces, most started while backward goes on (overlap)."""
    buckets.BUCKET_BYTES = bucket_bytes
    corpus = load_corpus(max_bytes=CORPUS_BYTES)
    out = {}
    for n in sizes:
        part = world.comm.Split(0 if world.rank < n else 1, world.rank)
        if world.rank < n:
            result = train(tiny(**overrides), corpus=corpus, progress=False, log=None,
                           world=MpiWorld(part))
            out[n] = outcome(result)
        part.Free()
        world.barrier()
    return out


def stopped_by_a_signal(world, signum, at, save):
    """Rank 1 receives `signum` at step `at` (from a callback of the loop); every rank stops
    after the same step, rank 0 saves. Returns (steps seen, the message) per rank."""
    corpus = load_corpus(max_bytes=CORPUS_BYTES)

    def hit(record):
        if world.rank == 1 and record["step"] == at:
            os.kill(os.getpid(), signum)

    try:
        train(tiny(log_every=5), corpus=corpus, progress=False, log=None, save=save,
              callbacks=[hit])
    except Interrupted as error:
        return str(error)
    return "not stopped"


def killed(world, at, save):
    """Rank 1 dies (SIGKILL) at step `at` of a run resumed from `save` (it never returns)."""
    corpus = load_corpus(max_bytes=CORPUS_BYTES)

    def hit(record):
        if world.rank == 1 and record["step"] >= at:
            os.kill(os.getpid(), signal.SIGKILL)

    train(tiny(steps=100_000, log_every=5, save_every=5), corpus=corpus, progress=False, log=None, save=save,
          resume=save, callbacks=[hit])


def refusals(world):
    """What each rank is told when the ranks were started differently: each its own seed, each
    its own corpus, `--ranks 3` under `mpiexec -n 2`, or a micro-batch left without rows. One
    sentence each, on every rank."""
    from smallem.errors import SmallemError
    from smallem.ranks.launch import ranks_of_train

    said = []
    for attempt in (lambda: train(tiny(seed=world.rank), corpus=load_corpus(
                        max_bytes=CORPUS_BYTES), progress=False, log=None),
                    lambda: train(tiny(), corpus=load_corpus(
                        max_bytes=CORPUS_BYTES * (1 + world.rank)), progress=False, log=None),
                    lambda: ranks_of_train(3, ["train"]),
                    lambda: train(tiny(batch=3, accumulate=2), corpus=load_corpus(
                        max_bytes=CORPUS_BYTES), progress=False, log=None)):
        try:
            attempt()
            said.append(None)
        except SmallemError as error:
            said.append(str(error))
    return said


def summed(world, values):
    """The all-reduce of `values` times (rank + 1)."""
    return world.allreduce(np.asarray(values, dtype=np.float64) * (world.rank + 1))

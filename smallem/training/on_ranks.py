"""What `smallem.ranks.run` calls on every rank for the training room: a whole run from a config's
JSON (`ranks.train`, a notebook's 2-rank run) and the step's time split into compute and
all-reduce, plain order against overlap (`ranks.bench`, `smallem bench --ranks N`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from ..backends import get_backend
from ..data import load_corpus
from ..optim import make_optimizer
from ..ranks import World
from .config import TrainConfig, build_model, config_from
from .loop import batch_sampler, train
from .ranked import RankedStep


def train_json(world: World, config: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """`train(config, **options)` on this rank; every rank returns the result's JSON."""
    result = train(config_from(config), world=world, **{"progress": False, **options})
    return result.to_json()


def time_split(world: World, config: dict[str, Any], steps: int, warmup: int,
               bucket_bytes: int) -> list[dict[str, Any]]:
    """The median step on this rank, plain order then overlap: its wall time, the time waiting
    for the all-reduce after backward (what the sum adds to the step), the compute (the rest),
    and the all-reduce of the same buffer alone (what overlap can hide at most)."""
    run = config_from(config)
    corpus = load_corpus(run.corpus, max_bytes=2_000_000)
    backend = get_backend(run.backend, run.precision)
    rows = []
    for overlap in (False, True):
        model = build_model(run, backend)
        optimizer = make_optimizer(run.optimizer, run.learning_rate, run.weight_decay, run.clip)
        step = RankedStep(backend, model, optimizer, world, accumulate=run.accumulate,
                          overlap=overlap, bucket_bytes=bucket_bytes)
        sampler = batch_sampler(run, corpus)
        walls, waits = [], []
        for k in range(warmup + steps):
            contexts, targets = sampler.next()
            world.barrier()  # every rank starts the step together: the wait is the sum's
            began = time.perf_counter()
            step(contexts, targets)
            if k >= warmup:
                walls.append(time.perf_counter() - began)
                waits.append(step.wait_seconds)
        assert step.buckets is not None
        flat = np.zeros_like(step.buckets.flat)
        alone = []
        for _ in range(steps):
            world.barrier()
            began = time.perf_counter()
            world.allreduce(flat)
            alone.append(time.perf_counter() - began)
        wall, wait = statistics.median(walls), statistics.median(waits)
        rows.append({"ranks": world.size, "overlap": overlap, "step_ms": 1e3 * wall,
                     "compute_ms": 1e3 * (wall - wait), "allreduce_wait_ms": 1e3 * wait,
                     "allreduce_alone_ms": 1e3 * statistics.median(alone),
                     "buckets": len(step.buckets.sizes), "gradient_bytes": int(flat.nbytes),
                     "batch": run.batch, "backend": run.backend, "model": run.model})
    return rows


__all__ = ["train_json", "time_split", "TrainConfig"]

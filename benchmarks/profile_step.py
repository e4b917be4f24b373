"""Where the time of one smallem training step goes, on one backend (default: gpu).

Prints the step split into forward / backward / optimizer (each closed by a device sync), the
number of backend calls per step by name, and cProfile's top functions. Used to write
benchmarks/NOTES.md; run as `python benchmarks/profile_step.py [gpu|cpu] [steps]`.
"""

from __future__ import annotations

import collections
import cProfile
import pstats
import statistics
import sys
import time

import numpy as np

from smallem.autodiff.tape import Tape
from smallem.backends import get_backend
from smallem.data import BatchSampler, load_corpus
from smallem.models.mlp import Mlp
from smallem.optim import AdamW


def main(backend_name: str = "gpu", steps: int = 300) -> None:
    backend = get_backend(backend_name)
    model, optimizer = Mlp(backend=backend, seed=0), AdamW(lr=2e-3, weight_decay=0.01)
    sampler = BatchSampler(load_corpus().train, 256, seed=0)
    batches = [sampler.next() for _ in range(32)]

    def phases(k: int, sync: bool) -> tuple[float, float, float]:
        contexts, targets = batches[k % len(batches)]
        t0 = time.perf_counter()
        tape = Tape(backend)
        loss = model.loss(tape, contexts, targets)
        if sync:
            backend.synchronize()
        t1 = time.perf_counter()
        grads = tape.backward(loss)
        if sync:
            backend.synchronize()
        t2 = time.perf_counter()
        optimizer.step(model.parameters(), grads)
        if sync:
            backend.synchronize()
        return t1 - t0, t2 - t1, time.perf_counter() - t2

    for k in range(30):
        phases(k, True)
    split = [phases(k, True) for k in range(steps)]
    for name, values in zip(("forward", "backward", "optimizer"), zip(*split)):
        print(f"{name:<10} {1e6 * statistics.median(values):8.1f} µs (synced)")
    backend.synchronize()
    t0 = time.perf_counter()
    for k in range(steps):
        phases(k, False)
    backend.synchronize()
    print(f"{'step':<10} {1e6 * (time.perf_counter() - t0) / steps:8.1f} µs (unsynced, mean)")

    # how many backend calls a step makes, by name
    counts: collections.Counter[str] = collections.Counter()
    originals = {}
    for name in dir(type(backend)):
        attr = getattr(backend, name)
        if callable(attr) and not name.startswith("__"):
            originals[name] = attr

            def counted(*a, _name=name, _fn=attr, **kw):
                counts[_name] += 1
                return _fn(*a, **kw)

            setattr(backend, name, counted)
    phases(0, False)
    for name in originals:
        delattr(backend, name)
    print("backend calls per step:", sum(counts.values()), dict(sorted(counts.items())))

    profile = cProfile.Profile()
    profile.enable()
    for k in range(steps):
        phases(k, False)
    backend.synchronize()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    np.set_printoptions(precision=3)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpu", int(sys.argv[2]) if len(sys.argv) > 2 else 300)

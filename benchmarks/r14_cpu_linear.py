"""Where a 16-thread Linear of the CPU step goes (issue 38, round 14): each of the step's five
Linears (4,096 rows), forward and rule, on smallem's engine as it runs in the step and beside
what would change it, all in one process, µs a call (median of REPS calls):

    python benchmarks/r14_cpu_linear.py [THREADS]     one JSON line per (shape, variant)

Variants: "one thread" (the compiled pieces on the caller alone: /THREADS is the ideal);
"hot" (calls back to back: the pool's helpers still spinning); "cold" (a GAP_US sleep before
each call, as between the step's operations: the helpers asleep on their futexes); "pieces 8",
"pieces 32", "pieces 64" (team.MAX_PIECES: fewer, larger or more, smaller row blocks, hot);
"openblas T" (one NumPy call a product, OpenBLAS's own T threads: x·W then + b; dy·Wᵀ, xᵀ·dy,
Σ dy); "torch T" (torch.set_num_threads(T): F.linear; mm, mm, sum). Then the pool's empty job
(16 pieces of nothing) hot and cold: the hand-over alone.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from cpu_linear import smallem_calls, torch_calls  # benchmarks/: the script's own folder

from smallem.backends import get_backend
from smallem.backends.cpu import compiled_team, linear, team, threads

ROWS, REPS, GAP_US = 4096, int(os.environ.get("REPS", "30")), 300
SHAPES = [(64, 192, False), (64, 64, True), (64, 256, False), (256, 64, True), (64, 257, False)]


def median_us(fn, gap_us: float = 0.0, reps: int = REPS, warm: int = 5) -> float:
    for _ in range(warm):
        fn()
    spans = []
    for _ in range(reps):
        if gap_us:
            time.sleep(gap_us * 1e-6)
        start = time.perf_counter()
        fn()
        spans.append(time.perf_counter() - start)
    return round(1e6 * float(np.median(spans)), 1)


def arrays(k: int, n: int):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, ROWS // 64, k)).astype(np.float32)
    w, b = rng.normal(size=(k, n)).astype(np.float32), rng.normal(size=n).astype(np.float32)
    r, g = (rng.normal(size=(64, ROWS // 64, n)).astype(np.float32) for _ in range(2))
    return x, w, b, r, g


def openblas_calls(k: int, n: int, residual: bool):
    x, w, b, r, g = arrays(k, n)
    x2, g2, r2 = x.reshape(ROWS, k), g.reshape(ROWS, n), r.reshape(ROWS, n)

    def forward():
        y = x2 @ w
        y += b
        if residual:
            y += r2
        return y
    return forward, lambda: (g2 @ w.T, x2.T @ g2, g2.sum(0))


def row(shape: str, variant: str, pair, gap: float = 0.0, **extra) -> None:
    f, r = pair
    print(json.dumps({"shape": shape, "variant": variant, "forward us": median_us(f, gap),
                      "rule us": median_us(r, gap), **extra}), flush=True)


def main(t: int) -> None:
    from threadpoolctl import threadpool_limits

    try:
        import torch
    except ImportError:  # here, without PyTorch: smallem's and OpenBLAS's rows only
        torch = None

    os.environ["SMALLEM_THREADS"] = str(t)
    get_backend("cpu")  # built first: its first build settles the team again (call 1's first
    threads.settle()  # "one thread" row ran on t threads); BLAS held to one thread, as a run's
    for k, n, residual in SHAPES:
        shape = f"{ROWS}x{k} @ {k}x{n}" + (" + r" if residual else "")
        team.resize(1)
        row(shape, "one thread", smallem_calls(k, n, residual))
        team.resize(t)
        row(shape, "hot", smallem_calls(k, n, residual))
        row(shape, "cold", smallem_calls(k, n, residual), GAP_US)
        for pieces in (8, 32, 64):
            team.MAX_PIECES = pieces
            row(shape, f"pieces {pieces}", smallem_calls(k, n, residual))
        team.MAX_PIECES = 16
        with threadpool_limits(limits=t, user_api="blas"):
            row(shape, f"openblas {t}", openblas_calls(k, n, residual))
        time.sleep(0.2)  # OpenBLAS's threads spin a while after their last call
        if torch is not None:
            torch.set_num_threads(t)
            row(shape, f"torch {t}", torch_calls(k, n, residual))
            time.sleep(0.2)
    pool = linear._pool()
    if pool is not None:
        x, w, b = np.zeros((128, 1), np.float32), np.zeros((1, 1), np.float32), np.zeros(1, np.float32)
        out, cuts = np.zeros((128, 1), np.float32), np.arange(0, 129, 8, dtype=np.int64)

        def empty() -> None:
            team.pooled(lambda h: pool.publish_forward(h, x, w, b, out, False, out, cuts), pool.finish, 16)
        print(json.dumps({"empty pool job": 16, "hot us": median_us(empty, 0, 200),
                          "cold us": median_us(empty, GAP_US, 200),
                          "spins": pool.spins, "sleeps": compiled_team.SLEEPS}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16)

"""One Linear of the small Transformer's CPU step (4,096 rows, float32), its forward and its rule,
on smallem's CPU engine and on PyTorch at the same thread count (torch.set_num_threads), to see
why the step's Linears gain ~2.4× from 16 cores (issue 38, round 10).

    python benchmarks/cpu_linear.py [THREADS ...]   one JSON line per (threads, shape, route)
    python benchmarks/cpu_linear.py concurrent [THREADS ...]   T threads each multiplying its own
                                 piece-sized arrays: does one-thread GEMM itself scale over cores?

smallem's routes, switched in this process: "pool" (compiled pieces, helpers spinning
SMALLEM_SPIN µs between runs: compiled_team.py), "pool, no spin" (the same, every helper woken
through its queue), "share" (round 9's compiled pieces, SMALLEM_POOL=0), "numpy calls"
(SMALLEM_LINEAR=numpy); each at team.GRAIN 8 (the default) and 1 (every thread woken). Medians
of REPS single calls in µs; "ideal" is the one-thread time of the same route over the threads.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from smallem.autodiff.operations import Linear, LinearAdd
from smallem.backends import get_backend
from smallem.backends.cpu import compiled, linear, team, threads

ROWS, REPS = 4096, int(os.environ.get("REPS", "40"))
SHAPES = [(64, 64, False), (64, 64, True), (64, 256, False), (256, 64, True), (64, 257, False)]
ROUTES = {"pool": ("1", "numba", None), "pool, no spin": ("1", "numba", 0.0),
          "share": ("0", "numba", None), "numpy calls": ("0", "numpy", None)}


def median_us(fn, reps: int = REPS, warm: int = 5) -> float:
    """Median µs of `reps` single calls of fn, after `warm` calls."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1e6 * float(np.median(times)), 1)


def smallem_calls(k: int, n: int, residual: bool):
    cpu = get_backend("cpu")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, ROWS // 64, k)).astype(np.float32)
    w, b = rng.normal(size=(k, n)).astype(np.float32), rng.normal(size=n).astype(np.float32)
    r, g = (rng.normal(size=(64, ROWS // 64, n)).astype(np.float32) for _ in range(2))
    if residual:
        return (lambda: linear.linear_add_forward(cpu, x, w, b, r, LinearAdd()),
                lambda: linear.linear_add_rule(cpu, g, None, x, w, b, r, LinearAdd()))
    return (lambda: linear.linear_forward(cpu, x, w, b, Linear()),
            lambda: linear.linear_rule(cpu, g, None, x, w, b, Linear()))


def torch_calls(k: int, n: int, residual: bool):
    import torch

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(ROWS, k, generator=gen), torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen)
    r, g = torch.randn(ROWS, n, generator=gen), torch.randn(ROWS, n, generator=gen)
    if residual:
        forward = lambda: torch.nn.functional.linear(x, w, b).add_(r)  # noqa: E731
    else:
        forward = lambda: torch.nn.functional.linear(x, w, b)  # noqa: E731
    return forward, lambda: (g.mm(w), g.t().mm(x), g.sum(0))  # autograd's dx, dW, db of a Linear


def main(counts: list[int]) -> None:
    import torch

    os.environ["SMALLEM_THREADS"] = "1"
    threads.settle()  # BLAS held to one thread, as a run's
    base = {}
    for t in counts:
        team.resize(t)
        torch.set_num_threads(t)
        for k, n, residual in SHAPES:
            shape = f"{ROWS}x{k} @ {k}x{n}" + (" + r" if residual else "")
            f, r = torch_calls(k, n, residual)
            print(json.dumps({"threads": t, "shape": shape, "route": "PyTorch",
                              "forward us": median_us(f), "rule us": median_us(r)}), flush=True)
            time.sleep(0.05)  # PyTorch's OpenMP threads spin a while after its last call
            for route, (pool, lin, spin) in ROUTES.items():
                os.environ[linear.POOL_ENV], os.environ[compiled.LINEAR_ENV] = pool, lin
                if team._pool is not None:
                    team._pool.spins = team._pool.default_spins if spin is None else 0
                for grain in (8.0, 1.0):
                    team.GRAIN = grain
                    f, r = smallem_calls(k, n, residual)
                    row = {"threads": t, "shape": shape, "route": route, "grain": grain,
                           "forward us": median_us(f), "rule us": median_us(r)}
                    key = (shape, route, grain)
                    if t == 1:
                        base[key] = row
                    elif key in base:
                        row["ideal forward"] = round(base[key]["forward us"] / t, 1)
                        row["ideal rule"] = round(base[key]["rule us"] / t, 1)
                    print(json.dumps(row), flush=True)
    team.GRAIN = 8.0


def _compiled_calls():
    """A numba loop calling compiled_linear's piece (NumPy's OpenBLAS sgemm, then the bias) `calls`
    times without the GIL: the team's pieces, with no team and no GIL between the calls."""
    import numba

    from smallem.backends.cpu import compiled_linear

    @numba.njit(nogil=True)
    def many(x, w, b, out, calls):
        for _ in range(calls):
            compiled_linear._forward_piece(x, w, b, out, False, out, 0, x.shape[0])
    return many


def concurrent(counts: list[int], m: int = 256, k: int = 64, n: int = 256, calls: int = 200) -> None:
    """Does one-thread GEMM scale over cores? T Python threads, each multiplying its own
    (m, k) @ (k, n) `calls` times (a Linear piece's size): NumPy's matmul (OpenBLAS held to one
    thread; the GIL released inside and taken back after every call), the same sgemm calls in one
    compiled loop (the GIL taken once), and PyTorch's mm at one thread; µs per call, median of
    the threads."""
    import threading

    import torch

    threads.settle()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    many = _compiled_calls()
    for lib in ("NumPy's OpenBLAS", "OpenBLAS from a compiled loop", "PyTorch"):
        for t in counts:
            spans, barrier = [0.0] * t, threading.Barrier(t)

            def worker(i: int) -> None:
                a = rng.normal(size=(m, k)).astype(np.float32)
                b = rng.normal(size=(k, n)).astype(np.float32)
                c = np.empty((m, n), np.float32)
                bias = np.zeros(n, np.float32)
                if lib == "PyTorch":
                    a, b, c = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c)
                    call = lambda: torch.mm(a, b, out=c)  # noqa: E731
                else:
                    call = lambda: np.matmul(a, b, out=c)  # noqa: E731
                for _ in range(10):
                    call()
                many(a, b, bias, c, 1) if lib.startswith("OpenBLAS") else None
                barrier.wait()
                start = time.perf_counter()
                if lib.startswith("OpenBLAS"):
                    many(a, b, bias, c, calls)
                else:
                    for _ in range(calls):
                        call()
                spans[i] = (time.perf_counter() - start) / calls

            pool = [threading.Thread(target=worker, args=(i,)) for i in range(t)]
            for th in pool:
                th.start()
            for th in pool:
                th.join()
            print(json.dumps({"concurrent": lib, "threads": t, "shape": f"{m}x{k} @ {k}x{n}",
                              "us per call": round(1e6 * float(np.median(spans)), 1),
                              "slowest": round(1e6 * max(spans), 1)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["concurrent"]:
        for n in (256, 64):  # the pieces of the 64 × 256 and 64 × 64 Linears
            concurrent([int(a) for a in sys.argv[2:]] or [1, 2, 4, 8, 16], n=n)
    else:
        main([int(a) for a in sys.argv[1:]] or [1, 2, 4, 8, 16])

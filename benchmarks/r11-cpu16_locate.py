"""Where the CPU engine's 16-thread step goes (issue 38, round 11, branch r11-cpu16): the measures
of the first device call, each printing JSON lines.

    python benchmarks/r11-cpu16_locate.py conc [THREADS ...]   T threads, each multiplying its own
        piece-sized arrays `calls` times: NumPy's matmul (the GIL taken back after every call),
        NumPy's OpenBLAS sgemm from one compiled loop (no GIL), a GEMM of our own from one
        compiled loop (numba, no BLAS, no GIL): does one-thread GEMM scale over cores, and if
        not, is it OpenBLAS or the machine?
    python benchmarks/r11-cpu16_locate.py one ROUTE T M N      one of those, for perf to record
    python benchmarks/r11-cpu16_locate.py empty [THREADS ...]  what the team's runs cost with no
        work: team.run of 16 no-op pieces, team.share of 16, the pool's (compiled_team) 16
"""

from __future__ import annotations

import json
import sys
import threading
import time

import numba
import numpy as np

from smallem.backends.cpu import compiled_linear, team, threads

K = 64


@numba.njit(nogil=True)
def blas_loop(x, w, out, calls):
    """`calls` sgemms of NumPy's OpenBLAS, out = x·w, from compiled code (no GIL between)."""
    m, k = x.shape
    n = w.shape[1]
    for _ in range(calls):
        compiled_linear._sgemm(101, 111, 111, m, n, k, compiled_linear.ONE,
                               compiled_linear._ptr(x), k, compiled_linear._ptr(w), n,
                               compiled_linear.ZERO, compiled_linear._ptr(out), n)


@numba.njit(nogil=True, fastmath={"contract"})
def own_gemm(x, w, out):
    """out = x·w, four rows at a time (each w row loaded once for four rows), each element's
    products added in k's order (FMA): LLVM vectorizes the loop over n."""
    m, k = x.shape
    n = w.shape[1]
    i = 0
    while i + 4 <= m:
        o0, o1, o2, o3 = out[i], out[i + 1], out[i + 2], out[i + 3]
        for j in range(n):
            o0[j] = 0.0
            o1[j] = 0.0
            o2[j] = 0.0
            o3[j] = 0.0
        for p in range(k):
            a0, a1, a2, a3 = x[i, p], x[i + 1, p], x[i + 2, p], x[i + 3, p]
            wp = w[p]
            for j in range(n):
                v = wp[j]
                o0[j] += a0 * v
                o1[j] += a1 * v
                o2[j] += a2 * v
                o3[j] += a3 * v
        i += 4
    while i < m:
        o = out[i]
        for j in range(n):
            o[j] = 0.0
        for p in range(k):
            a = x[i, p]
            for j in range(n):
                o[j] += a * w[p, j]
        i += 1


@numba.njit(nogil=True)
def own_loop(x, w, out, calls):
    for _ in range(calls):
        own_gemm(x, w, out)


def _call(route: str, x, w, out, calls: int) -> None:
    if route == "numpy matmul":
        for _ in range(calls):
            np.matmul(x, w, out=out)
    elif route == "openblas loop":
        blas_loop(x, w, out, calls)
    else:
        own_loop(x, w, out, calls)


ROUTES = ("numpy matmul", "openblas loop", "own gemm loop")


def side_by_side(route: str, t: int, m: int, n: int, calls: int) -> dict:
    """t threads each running `calls` of (m, K) @ (K, n) on arrays of their own; µs a call."""
    spans, barrier = [0.0] * t, threading.Barrier(t)

    def worker(i: int) -> None:
        rng = np.random.default_rng(i)
        x = rng.normal(size=(m, K)).astype(np.float32)
        w = rng.normal(size=(K, n)).astype(np.float32)
        out = np.empty((m, n), np.float32)
        _call(route, x, w, out, 5)
        barrier.wait()
        start = time.perf_counter()
        _call(route, x, w, out, calls)
        spans[i] = (time.perf_counter() - start) / calls

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(t)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return {"route": route, "threads": t, "shape": f"{m}x{K} @ {K}x{n}",
            "us per call": round(1e6 * float(np.median(spans)), 1), "slowest": round(1e6 * max(spans), 1)}


def check() -> dict:
    """The own GEMM against float64 (its error, in float32 eps), and against NumPy's bits."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(257, K)).astype(np.float32)
    w = rng.normal(size=(K, 257)).astype(np.float32)
    out = np.empty((257, 257), np.float32)
    own_gemm(x, w, out)
    ref = x.astype(np.float64) @ w.astype(np.float64)
    bound = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64)
    err = float(np.max(np.abs(out - ref) / bound) / np.finfo(np.float32).eps)
    return {"own gemm max err / (|x||w| eps)": err,
            "equal to numpy's bits": float(np.mean(out == x @ w))}


def conc(counts: list[int]) -> None:
    threads.settle()  # OpenBLAS held to one thread
    print(json.dumps(check()), flush=True)
    for m, n, calls in ((256, 64, 400), (256, 256, 150), (64, 64, 1200)):
        for route in ROUTES:
            for t in counts:
                print(json.dumps(side_by_side(route, t, m, n, calls)), flush=True)


def empty(counts: list[int]) -> None:
    """µs a run of the team costs with 16 pieces of nothing: its hand-over and waits alone."""
    import os

    from cpu_linear import median_us as timed  # benchmarks/: the script's own folder

    from smallem.backends.cpu import compiled_team, linear

    def median_us(fn) -> float:
        return timed(fn, reps=300, warm=20)

    x, w, b = np.zeros((128, 1), np.float32), np.zeros((1, 1), np.float32), np.zeros(1, np.float32)
    out, cuts = np.zeros((128, 1), np.float32), np.arange(0, 129, 8, dtype=np.int64)
    for t in counts:
        os.environ["SMALLEM_THREADS"] = str(t)
        threads.settle()
        parts = list(range(16))
        row = {"threads": t, "run us": median_us(lambda: team.run(lambda p: None, parts))}

        def shared() -> None:  # a fresh counter a run, as linear.py's: a helper late from the last
            counter = np.zeros(1, np.int64)  # run may still take from that one's
            team.share(lambda: compiled_linear.linear_forward(x, w, b, out, False, out, cuts, counter), 16)
        row["share us"] = median_us(shared)
        if t > 1:
            if team._pool is None:
                team.attach(compiled_team.Pool(team.spin_us()))
            pool = team._pool
            row["pool us"] = median_us(lambda: team.pooled(
                lambda h: pool.publish_forward(h, x, w, b, out, False, out, cuts), pool.finish, 16))
            row["run after pool us"] = median_us(lambda: (team.pooled(
                lambda h: pool.publish_forward(h, x, w, b, out, False, out, cuts), pool.finish, 16),
                team.run(lambda p: None, parts)))
        print(json.dumps(row), flush=True)
    del linear


if __name__ == "__main__":
    what, rest = sys.argv[1], [int(a) for a in sys.argv[2:] if a.isdigit()]
    if what == "conc":
        conc(rest or [1, 2, 4, 8, 16])
    elif what == "empty":
        empty(rest or [1, 2, 4, 8, 16])
    elif what == "one":  # one ROUTE-index T M N: for perf
        threads.settle()
        r, t, m, n = rest
        print(json.dumps(side_by_side(ROUTES[r], t, m, n, 4000)), flush=True)

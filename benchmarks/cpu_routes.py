"""The two routes issue 38 asks to measure against each other, on two of the fused table's
entries at the step's shapes: Python threads over NumPy calls on row blocks (backends/cpu/, the
team) against numba prange kernels (numba's own thread pool), each at 1 thread and at THREADS.
Round 7's comparison; round 8's route (backends/cpu/compiled.py, the `fast` extra) runs serial
numba kernels on the team instead, measured by cpu_round8_device.sh.

    python benchmarks/cpu_routes.py [THREADS]    -> one JSON line per (entry, route, threads)
"""

from __future__ import annotations

import json
import math
import sys
import time

import numpy as np

from smallem.backends import get_backend, numpy_fused
from smallem.backends.array import GELU_CUBIC, GELU_SCALE
from smallem.backends.cpu import team


def median_seconds(fn, repeats: int) -> float:
    """The median of `repeats` calls, in seconds (one warm-up call first)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def best_ms(fn, repeats: int = 30) -> float:
    return round(1e3 * median_seconds(fn, repeats), 3)


def numba_kernels():
    import numba

    @numba.njit(parallel=True, fastmath=True, cache=False)
    def gelu(a, out):
        flat, res = a.reshape(-1), out.reshape(-1)
        for i in numba.prange(flat.size):
            x = flat[i]
            res[i] = 0.5 * x * (1.0 + math.tanh(GELU_SCALE * (x + GELU_CUBIC * x * x * x)))

    @numba.njit(parallel=True, fastmath=True, cache=False)
    def layer_norm(x, w, b, eps, out):
        n, c = x.shape
        for i in numba.prange(n):
            mean = 0.0
            for j in range(c):
                mean += x[i, j]
            mean /= c
            var = 0.0
            for j in range(c):
                d = x[i, j] - mean
                var += d * d
            inv = 1.0 / math.sqrt(var / c + eps)
            for j in range(c):
                out[i, j] = (x[i, j] - mean) * inv * w[j] + b[j]

    return numba, gelu, layer_norm


def main(threads: int) -> None:
    get_backend("cpu")
    rng = np.random.default_rng(0)
    a = rng.normal(size=(4096, 256)).astype(np.float32)  # the MLP block's hidden layer (B·T, 4C)
    x = rng.normal(size=(4096, 64)).astype(np.float32)  # LayerNorm's input (B·T, C)
    w, b = np.ones(64, np.float32), np.zeros(64, np.float32)

    class Op:
        eps = 1e-5

    for n in (1, threads):
        team.resize(n)
        print(json.dumps({"entry": "gelu (4096, 256)", "route": "numpy team", "threads": n,
                          "ms": best_ms(lambda: numpy_fused.gelu(a))}), flush=True)
        print(json.dumps({"entry": "layer_norm (4096, 64)", "route": "numpy team", "threads": n,
                          "ms": best_ms(lambda: numpy_fused.layer_norm_forward(None, x, w, b, Op))}),
              flush=True)
    start = time.perf_counter()
    numba, gelu, layer_norm = numba_kernels()
    out_a, out_x = np.empty_like(a), np.empty_like(x)
    gelu(a, out_a)
    layer_norm(x, w, b, 1e-5, out_x)
    print(json.dumps({"numba": numba.__version__, "compile s": round(time.perf_counter() - start, 2)}))
    assert np.abs(out_a - numpy_fused.gelu(a)).max() < 1e-5
    for n in (1, threads):
        numba.set_num_threads(n)
        print(json.dumps({"entry": "gelu (4096, 256)", "route": "numba prange", "threads": n,
                          "ms": best_ms(lambda: gelu(a, out_a))}), flush=True)
        print(json.dumps({"entry": "layer_norm (4096, 64)", "route": "numba prange", "threads": n,
                          "ms": best_ms(lambda: layer_norm(x, w, b, 1e-5, out_x))}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16)

"""Why one core of the device host ran the float32 step at 125 ms where this 2-core machine runs
it at 66 (round 7): the machine's configuration, and the step's kinds of work timed one by one on
one thread (issue 38, round 8).

    python benchmarks/cpu_diag.py info     -> NumPy's build, BLAS's threads and kernels, clocks, quotas
    python benchmarks/cpu_diag.py micro    -> µs of each kind of work at the step's shapes, one thread
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
from cpu_routes import median_seconds  # benchmarks/, this script's folder: the one timer


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "-"


def info() -> dict:
    from threadpoolctl import threadpool_info

    mhz = [float(line.split(":")[1]) for line in _read("/proc/cpuinfo").splitlines()
           if line.startswith("cpu MHz")]
    with redirect_stdout(io.StringIO()):
        config = np.show_config(mode="dicts")
    return {"numpy": np.__version__, "simd": config.get("SIMD Extensions"),
            "blas build": config.get("Build Dependencies", {}).get("blas", {}).get("openblas configuration"),
            "pools": [{k: p.get(k) for k in ("internal_api", "num_threads", "architecture", "version")}
                      for p in threadpool_info()],
            "cpu MHz min/max": [min(mhz, default=0), max(mhz, default=0)],
            "cpu.max": _read("/sys/fs/cgroup/cpu.max"),
            "cpu.stat throttled": [line for line in _read("/sys/fs/cgroup/cpu.stat").splitlines()
                                   if "throttled" in line],
            "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
            "affinity": sorted(os.sched_getaffinity(0)), "load": os.getloadavg()[0],
            "OPENBLAS_*": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS")}}


def best_us(fn, repeats: int = 40) -> float:
    """The median of `repeats` calls, µs (one warm-up call first)."""
    return round(1e6 * median_seconds(fn, repeats), 1)


def micro() -> dict:
    """One thread: the step's kinds of work at its shapes (batch 64 × context 64, width 64)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")
    rng = np.random.default_rng(0)
    f = np.float32
    big, small = rng.normal(size=1 << 22).astype(f), rng.normal(size=1 << 16).astype(f)
    big_out, small_out = np.empty_like(big), np.empty_like(small)
    hidden = rng.normal(size=(4096, 256)).astype(f)
    rows, bias = rng.normal(size=(4096, 64)).astype(f), rng.normal(size=64).astype(f)
    w1, w2 = rng.normal(size=(64, 256)).astype(f), rng.normal(size=(256, 64)).astype(f)
    q, k = rng.normal(size=(64, 4, 64, 16)).astype(f), rng.normal(size=(64, 4, 16, 64)).astype(f)
    subnormal = np.full(1 << 16, 1e-39, f)

    def python_loop():
        total = 0
        for i in range(100_000):
            total += i

    out = {
        "python loop of 100k adds": best_us(python_loop, 10),
        "copy 16 MB (GB/s)": round(big.nbytes / best_us(lambda: np.copyto(big_out, big), 10) / 1e3, 1),
        "copy 256 KB (GB/s)": round(small.nbytes / best_us(lambda: np.copyto(small_out, small)) / 1e3, 1),
        "exp 64K in cache": best_us(lambda: np.exp(small, out=small_out)),
        "tanh 64K in cache": best_us(lambda: np.tanh(small, out=small_out)),
        "multiply 64K in cache": best_us(lambda: np.multiply(small, small, out=small_out)),
        "multiply 64K subnormal": best_us(lambda: np.multiply(subnormal, 0.5, out=small_out)),
        "exp 4M": best_us(lambda: np.exp(big, out=big_out), 10),
        "multiply 4M": best_us(lambda: np.multiply(big, big, out=big_out), 10),
        "add bias (4096, 64)": best_us(lambda: rows + bias),
        "row sums einsum (4096, 64)": best_us(lambda: np.einsum("ij->i", rows)),
        "small call: add (8, 64)": best_us(lambda: rows[:8] + bias, 200),
        "matmul 4096x64x256": best_us(lambda: rows @ w1),
        "matmul 4096x256x64": best_us(lambda: hidden @ w2),
        "stacked (64,4,64,16)@(64,4,16,64)": best_us(lambda: np.matmul(q, k)),
    }
    try:
        from smallem.backends.cpu import compiled_kernels

        flat, y = hidden.reshape(-1), np.empty(hidden.size, f)
        start = time.perf_counter()
        compiled_kernels.gelu(flat, y)
        out["numba first gelu call (compile or cache load) s"] = round(time.perf_counter() - start, 2)
        out["numba gelu (4096, 256)"] = best_us(lambda: compiled_kernels.gelu(flat, y))
    except ImportError:
        out["numba"] = "absent"
    from smallem.backends import numpy_fused

    os.environ["SMALLEM_KERNELS"] = "numpy"
    out["numpy gelu (4096, 256)"] = best_us(lambda: numpy_fused.gelu(hidden))
    return out


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "micro"
    print(json.dumps({"info": info, "micro": micro}[what]()), flush=True)

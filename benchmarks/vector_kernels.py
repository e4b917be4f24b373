"""The memory-bound kernels one float a thread against four (common.VECTORS), each alone, at the
8 × 512 step's shapes in bf16 (B·T = 64 · 256 rows: GELU over 4C = 2,048 columns, the adds and
LayerNorm over C = 512): µs per launch (CUDA events, median of 5 blocks of 50) and the bytes
each moves per µs.

    python benchmarks/vector_kernels.py [OUT.json]
"""

from __future__ import annotations

import json
import sys

import cupy
import numpy as np

from smallem.autodiff.operations import LayerNorm
from smallem.backends import get_backend
from smallem.backends.cuda import common, gelu
from smallem.backends.cuda.elementwise import add_with_copy
from smallem.backends.cuda.layer_norm import layer_norm_forward

ROWS, C = 64 * 256, 512


def timed(fn) -> float:
    for _ in range(5):
        fn()
    blocks = []
    for _ in range(5):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(50):
            fn()
        stop.record()
        stop.synchronize()
        blocks.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3 / 50)
    return float(np.median(blocks))


def main() -> None:
    be = get_backend("gpu", "bf16")
    rng = np.random.default_rng(0)
    a4, g4 = (cupy.asarray(rng.normal(size=(ROWS, 4 * C)), cupy.float32) for _ in range(2))
    x, z = (cupy.asarray(rng.normal(size=(ROWS, C)), cupy.float32) for _ in range(2))
    w, b = cupy.ones(C, cupy.float32), cupy.zeros(C, cupy.float32)
    n4, n = ROWS * 4 * C, ROWS * C
    cases = {  # name -> (launch, bytes moved: float32 reads and writes, the bf16 copy)
        "gelu_forward": (lambda: gelu.gelu(a4, "bf16"), n4 * 10),
        "gelu_backward": (lambda: gelu.gelu_rule(be, g4, a4, a4), n4 * 14),
        "add_half": (lambda: add_with_copy(x, z, "bf16"), n * 14),
        "layer_norm_forward": (lambda: layer_norm_forward(be, x, w, b, LayerNorm()), n * 10)}
    rows = []
    for name, (fn, nbytes) in cases.items():
        us = {}
        for on in (False, True):
            common.VECTORS = on
            us["four" if on else "one"] = timed(fn)
        rows.append({"kernel": name, "one_us": us["one"], "four_us": us["four"],
                     "one_GBps": nbytes / us["one"] / 1e3, "four_GBps": nbytes / us["four"] / 1e3})
        print(f"{name:<20} one a thread {us['one']:8.1f} us ({nbytes / us['one'] / 1e3:6.0f} GB/s)   "
              f"four {us['four']:8.1f} us ({nbytes / us['four'] / 1e3:6.0f} GB/s)  "
              f"{us['four'] / us['one']:.2f}x", flush=True)
    common.VECTORS = True
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as fh:
            json.dump({"rows": rows, "shape": [ROWS, C]}, fh, indent=1)


if __name__ == "__main__":
    main()

"""Notebook 14's recorded GPU results: square products per format, and the lesson's fp16 runs.

On a GPU: (1) square products of 2048 and 8192 through cuBLAS (fp32) and cuBLASLt (tf32, bf16,
fp16), CUDA-event medians; (2) the lesson's small Transformer (short_runs.LESSON_MODEL),
its loss scaled as in a 1M-token batch, trained `--steps` steps in fp32, fp16 without a loss
scale, fp16 with the LossScaler and bf16, on the GPU. Writes one JSON (`--out`), which
recorded/precision_h200.json beside this file copies. Run on a GPU:
`python3 -m smallem.course.l14_precision.record`. The step times per precision come from
`smallem bench --precision` (benchmarks/results/round4/precision_bench.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import cupy
import numpy as np

from smallem.backends.cuda.tensor_cores import Lt
from smallem.backends.precision import LossScaler
from smallem.course.l14_precision.short_runs import LESSON_FACTOR, LESSON_MODEL, short_run
from smallem.data import load_corpus


def products(sizes: tuple[int, ...] = (2048, 8192)) -> dict:
    lt, rng, out = Lt(), np.random.default_rng(0), {}
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for n in sizes:
        a = cupy.asarray(rng.standard_normal((n, n)).astype(np.float32))
        b = cupy.asarray(rng.standard_normal((n, n)).astype(np.float32))
        d = cupy.empty((n, n), np.float32)
        row = {}
        for precision in ("fp32", "tf32", "bf16", "fp16"):
            times = []
            for _ in range(23):
                start.record()
                if precision == "fp32":
                    cupy.matmul(a, b, out=d)
                else:
                    lt.gemm(precision, 0, 0, n, n, n, b, n, a, n, d, n)
                end.record()
                end.synchronize()
                times.append(cupy.cuda.get_elapsed_time(start, end))
            ms = float(np.median(times[3:]))
            row[precision] = {"ms": ms, "tflops": 2 * n ** 3 / ms / 1e9}
        out[str(n)] = row
    return out


def runs(steps: int) -> dict:
    corpus = load_corpus(max_bytes=2_000_000)
    out = {}
    for label, precision, scaler in (("fp32", "fp32", None), ("fp16, no loss scale", "fp16", None),
                                     ("fp16 + loss scaler", "fp16", LossScaler(interval=200)),
                                     ("bf16", "bf16", None)):
        began = time.perf_counter()
        losses = short_run(precision, steps=steps, scaler=scaler, loss_factor=LESSON_FACTOR,
                           tokens=corpus.train, backend="gpu")
        out[label] = {"precision": precision, "losses": [round(x, 5) for x in losses],
                      "seconds": time.perf_counter() - began,
                      "skipped": scaler.skipped if scaler else 0,
                      "final_scale": scaler.scale if scaler else None}
        print(label, np.mean(losses[-100:]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", default="precision_h200.json")
    args = parser.parse_args()
    result = {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
              "python": platform.python_version(), "cupy": cupy.__version__,
              "model": {"layers": LESSON_MODEL.layers, "width": LESSON_MODEL.width,
                        "heads": LESSON_MODEL.heads, "context": LESSON_MODEL.context},
              "loss_factor": LESSON_FACTOR, "steps": args.steps,
              "products": products(), "runs": runs(args.steps)}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["products"], indent=1))


if __name__ == "__main__":
    main()

"""The captured Transformer step in each precision against PyTorch's in the same precision (a
first look on the device before `smallem bench --precision`): CUDA-event medians, one process."""

from __future__ import annotations

import sys

import numpy as np

from smallem.backends import get_backend
from smallem.models.transformer import Transformer, TransformerConfig
from smallem.optim import AdamW
from smallem.tools.bench_reference import TorchTransformer
from smallem.training.step import make_step


def timed(step, sync, batches, warm=20, reps=100):
    for x, y in batches[:warm]:
        step(x, y)
    sync()
    import cupy
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for i in range(reps):
        x, y = batches[i % len(batches)]
        step(x, y)
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / reps


def main() -> int:
    sizes = {"default": dict(), "8x512": dict(layers=8, width=512, heads=8, context=256)}
    for label, kw in sizes.items():
        config = TransformerConfig(**kw)
        rng = np.random.default_rng(0)
        batches = [(rng.integers(0, 257, (64, config.context)), rng.integers(0, 257, (64, config.context)))
                   for _ in range(8)]
        for precision in ("fp32", "tf32", "bf16"):
            be = get_backend("gpu", precision)
            model = Transformer(config, be, seed=0)
            step = make_step(be, model, AdamW(lr=1e-3), capture=True)
            ms = timed(step, be.synchronize, batches, reps=100 if label == "default" else 20)
            ref = TorchTransformer(Transformer(config, "cpu64", seed=0), "cuda", graph=True, sdpa=True,
                                   precision=precision)
            tms = timed(ref.step, ref.synchronize, batches, reps=100 if label == "default" else 20)
            print(f"{label:8} {precision}: smallem captured {ms:8.3f} ms  PyTorch graph+SDPA {tms:8.3f} ms"
                  f"  ratio {ms / tms:5.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

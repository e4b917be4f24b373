"""The captured GPU step against the plain one over 2,000 steps of the default run (batch 256,
AdamW, seed 0): every step's loss, the largest difference, and the time per step of each; and
the plain run twice, to see what the embedding's unordered atomic adds leave between two runs.

    python benchmarks/capture_check.py [STEPS] [JSON]
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from smallem.backends import get_backend
from smallem.data import BatchSampler, load_corpus
from smallem.models.mlp import Mlp
from smallem.optim import make_optimizer
from smallem.training.step import make_step


def run(capture: bool, steps: int, corpus) -> tuple[np.ndarray, float]:
    gpu = get_backend("gpu")
    model = Mlp(backend=gpu, seed=0)
    step = make_step(gpu, model, make_optimizer("adamw"), capture=capture)
    sampler = BatchSampler(corpus.train, 256, 16, seed=[0, 1])
    batches = [sampler.next() for _ in range(steps)]
    losses = gpu.zeros((steps,))
    gpu.synchronize()
    start = time.perf_counter()
    for k, batch in enumerate(batches):
        losses[k] = step(*batch)  # stays on the device: no sync inside the loop
    gpu.synchronize()
    return gpu.to_numpy(losses).astype(np.float64), time.perf_counter() - start


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    corpus = load_corpus()
    plain, t_plain = run(False, steps, corpus)
    again, _ = run(False, steps, corpus)  # the same plain run twice: what atomics leave
    captured, t_captured = run(True, steps, corpus)
    diff = np.abs(plain - captured)
    out = {"steps": steps, "max_abs_difference": float(diff.max()),
           "plain_vs_plain_max_abs_difference": float(np.abs(plain - again).max()),
           "plain_vs_plain_first_difference_step": int(np.argmax(plain != again)) + 1
           if np.any(plain != again) else None,
           "step_of_max": int(diff.argmax()) + 1, "plain_ms_per_step": 1e3 * t_plain / steps,
           "captured_ms_per_step": 1e3 * t_captured / steps,
           "final_loss_plain": float(plain[-1]), "final_loss_captured": float(captured[-1]),
           "plain_losses": plain[::50].tolist(), "captured_losses": captured[::50].tolist()}
    print(json.dumps({k: v for k, v in out.items() if not k.endswith("_losses")}, indent=1))
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()

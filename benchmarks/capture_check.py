"""The captured GPU step against the plain one over 2,000 steps of the default run (AdamW, seed
0; the MLP at batch 256, or the Transformer at batch 64 × 64 bytes): every step's loss, the
largest difference, and the time per step of each; and the plain run twice, to see what the
embedding's unordered atomic adds leave between two runs.

    python benchmarks/capture_check.py [STEPS] [JSON] [mlp|transformer]
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from smallem.backends import get_backend
from smallem.data import BatchSampler, load_corpus
from smallem.optim import make_optimizer
from smallem.tools.bench import build, sequence_batches
from smallem.training.step import make_step


def run(capture: bool, steps: int, corpus, model_name: str = "mlp") -> tuple[np.ndarray, float]:
    gpu = get_backend("gpu")
    model = build(model_name, gpu, 0)
    step = make_step(gpu, model, make_optimizer("adamw"), capture=capture)
    if model_name == "transformer":
        batches = sequence_batches(corpus.train, 64, model.config.context, steps, seed=1)
    else:
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
    name = sys.argv[3] if len(sys.argv) > 3 else "mlp"
    corpus = load_corpus()
    plain, t_plain = run(False, steps, corpus, name)
    again, _ = run(False, steps, corpus, name)  # the same plain run twice: what atomics leave
    captured, t_captured = run(True, steps, corpus, name)
    diff = np.abs(plain - captured)
    noise = float(np.abs(plain - again).max())
    out = {"model": name, "steps": steps, "max_abs_difference": float(diff.max()),
           "within_plain_noise": bool(diff.max() <= max(1e-5, 4 * noise)),
           "final_mean_difference_last_100": float(np.mean(captured[-100:]) - np.mean(plain[-100:])),
           "plain_vs_plain_max_abs_difference": noise,
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

"""Where the GPU's time goes in one Transformer training step: every kernel of 20 plain steps
(the same kernels a captured step replays) timed by CUPTI through torch.profiler, which sees
CuPy's and cuBLAS's launches too; the top kernels per step and the total.

    python benchmarks/profile_transformer.py [STEPS] [OUT.txt]
"""

from __future__ import annotations

import sys

from torch.profiler import ProfilerActivity, profile

from smallem.backends import get_backend
from smallem.data import load_corpus
from smallem.optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
from smallem.tools.bench import build, sequence_batches
from smallem.training.step import make_step


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    gpu = get_backend("gpu")
    model = build("transformer", gpu, 0)
    step = make_step(gpu, model, AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY),
                     capture=False)
    batches = sequence_batches(load_corpus().train, 64, model.config.context, steps + 5, seed=1)
    for b in batches[:5]:
        step(*b)
    gpu.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for b in batches[5:]:
            step(*b)
        gpu.synchronize()
    averages = list(prof.key_averages())
    key = "self_device_time_total" if averages and hasattr(averages[0], "self_device_time_total") \
        else "self_cuda_time_total"
    events = [e for e in averages if getattr(e, key, 0) > 0]
    if not events:
        print("the profiler saw no GPU activity")
        return
    events.sort(key=lambda e: -getattr(e, key))
    total = sum(getattr(e, key) for e in events)
    lines = [f"GPU time per plain Transformer step: {total / steps / 1e3:.3f} ms over "
             f"{sum(e.count for e in events) / steps:.0f} kernels/copies per step"]
    for e in events[:30]:
        lines.append(f"{getattr(e, key) / steps:9.1f} us/step {e.count / steps:6.1f}x  "
                     f"{e.key[:90]}")
    text = "\n".join(lines)
    print(text)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()

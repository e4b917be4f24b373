"""Where the GPU's time goes in one Transformer training step: every kernel of 20 plain steps
(the same kernels a captured step replays) timed by CUPTI through torch.profiler, which sees
CuPy's and cuBLAS's launches too; the top kernels per step, the total, and attention's share
(the flash kernels and their helpers: every kernel whose name says flash or attention).

    python benchmarks/profile_transformer.py [STEPS] [OUT.txt] [PRECISION] [SIZE] [SWITCH ...]

PRECISION: fp32 (default), tf32, bf16, fp16; SIZE: default or a bench_precision.SIZES name
(2x512, 8x128, 8x512), batch 64 as bench --sizes times them. SWITCH: `old`, the Linears without
the GEMM epilogues (cuda/linear.py's EPILOGUES off: product, bias add and column sum apart);
`narrow`, the 32-column column sums (reductions.WIDE off); `apart`, the residual adds a pass of
their own (linear.RESIDUAL off); `rows`,
LayerNorm's rule summing a pair per row of x (layer_norm.ROW_SUMS off); `unpacked`, q, k, v by
three Linears (qkv.QKV off); `scalar`, one float a thread in the memory-bound kernels
(common.VECTORS off); `nosums`, the expand Linear's db by a column sum (gelu.SUMS off).
"""

from __future__ import annotations

import sys

from torch.profiler import ProfilerActivity, profile

from smallem.backends import get_backend
from smallem.backends.precision import LossScaler
from smallem.data import load_corpus
from smallem.optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
from smallem.tools.bench import build, sequence_batches
from smallem.tools.bench_precision import SIZES
from smallem.training import registry
from smallem.training.step import make_step


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    precision = sys.argv[3] if len(sys.argv) > 3 else "fp32"
    size = sys.argv[4] if len(sys.argv) > 4 else "default"
    from smallem.backends.cuda import common, gelu, layer_norm, linear, qkv, reductions

    switches = set(sys.argv[5:])
    # read when the backend is made, just below (WIDE: at every column sum)
    linear.EPILOGUES = "old" not in switches
    reductions.WIDE = "narrow" not in switches
    linear.RESIDUAL = "apart" not in switches
    layer_norm.ROW_SUMS = "rows" not in switches
    qkv.QKV = "unpacked" not in switches
    common.VECTORS = "scalar" not in switches
    gelu.SUMS = "nosums" not in switches
    gpu = get_backend("gpu", precision)
    model = (build("transformer", gpu, 0) if size == "default"
             else registry.get("transformer").build(SIZES[size], gpu, 0))
    scaler = LossScaler() if precision == "fp16" else None
    step = make_step(gpu, model, AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY),
                     capture=False, scaler=scaler)
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
    attention = sum(getattr(e, key) for e in events
                    if "flash" in e.key or "attention" in e.key)
    label = ", ".join([precision, size, *sys.argv[5:]])
    lines = [f"GPU time per plain Transformer step ({label}): {total / steps / 1e3:.3f} "
             f"ms over {sum(e.count for e in events) / steps:.0f} kernels/copies per step; "
             f"attention {attention / steps / 1e3:.3f} ms ({attention / total:.0%})"]
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

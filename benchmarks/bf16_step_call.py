"""The bf16 step (issue 36): smallem's captured Transformer step with a round's paths and
without, PyTorch's best setup in the same precision beside them (CUDA graph, fused AdamW, SDPA),
one process, blocks timed in turn. Round 9's variants: "round8" (three Linears for q, k, v, one
float a thread in the memory-bound kernels: the path before this round), "qkv" (q, k, v as one
product: cuda/qkv.py), "new" (qkv, and four floats a thread: common.VECTORS), "sums" (new, and
GELU's rule summing da's columns for the expand Linear's db: gelu.SUMS). Its "apart" variant
(dx and dW from dq, dk, dv apart, measured slower, since removed) ran at 34e4c6d.
Round 8's ("round7", "new", "gelu": gelu_linear, deleted in round 9) ran at 78e8216.

    python benchmarks/bf16_step_call.py OUT.json [PRECISIONS] [SIZES]
SIZES: default, or bench_precision.SIZES names (8x512, ...).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from smallem.backends.cuda import common, gelu, qkv
from smallem.backends.cupy import CupyBackend
from smallem.data import load_corpus
from smallem.optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
from smallem.tools.bench import Runner, machine, time_all
from smallem.tools.bench_precision import SIZES, _batches, _torch, step_flops
from smallem.training import registry
from smallem.training.step import make_step

VARIANTS = {"round8": {"QKV": False, "VECTORS": False, "SUMS": False},
            "qkv": {"QKV": True, "VECTORS": False, "SUMS": False},
            "new": {"QKV": True, "VECTORS": True, "SUMS": False},
            "sums": {"QKV": True, "VECTORS": True, "SUMS": True}}
HOMES = {"QKV": qkv, "VECTORS": common, "SUMS": gelu}


def _set(flags: dict) -> dict:
    kept = {name: getattr(HOMES[name], name) for name in flags}
    for name, value in flags.items():
        setattr(HOMES[name], name, value)
    return kept


def smallem_step(config: Any, precision: str, flags: dict) -> tuple:
    kept = _set(flags)  # QKV is read as the backend is made
    try:
        be = CupyBackend(precision)
    finally:
        _set(kept)
    net = registry.get("transformer").build(config, be, 0)
    step = make_step(be, net, AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY), capture=True)

    def run(*batch: Any) -> Any:  # the launch-time switches as this variant wants while it records
        before = _set(flags)
        try:
            return step(*batch)
        finally:
            _set(before)

    return run, be.synchronize, be.item


def main() -> None:
    args = sys.argv[1:]
    out = args[0]
    precisions = (args[1] if len(args) > 1 else "bf16").split(",")
    sizes = (args[2] if len(args) > 2 else "8x512,default").split(",")
    tokens = load_corpus().train
    rows = []
    print("ms per captured step, median of blocks; ratio = smallem / PyTorch in that precision")
    print(f"{'size':<8} {'prec':<5} " + " ".join(f"{v:>8}" for v in VARIANTS) + f" {'PyTorch':>8} "
          + " ".join(f"{v:>7}" for v in VARIANTS) + "  losses")
    for size in sizes:
        entry = registry.get("transformer")
        config = entry.bench_config("gpu") if size == "default" else SIZES[size]
        batch = entry.batch if size == "default" else 64
        plan = (50, 500, 50) if size == "default" else (5, 40, 10) if size != "8x512" else (4, 20, 8)
        batches = _batches("transformer", config, batch, tokens, 0)
        for p in precisions:
            made = [smallem_step(config, p, flags) for flags in VARIANTS.values()]
            made.append(_torch("transformer", config, p, 0))
            runners = [Runner(step, sync, batches) for step, sync, _ in made]
            time_all(runners, *plan)
            ms = [1e3 * float(np.median(r.seconds)) for r in runners]
            loss = [read(r.loss) for (_, _, read), r in zip(made, runners)]
            flops = step_flops("transformer", config, batch)
            row = {"size": size, "precision": p, **{f"{v}_ms": t for v, t in zip(VARIANTS, ms)},
                   "torch_ms": ms[-1], **{f"ratio_{v}": t / ms[-1] for v, t in zip(VARIANTS, ms)},
                   "tflops_new": flops / (ms[1] * 1e-3) / 1e12,
                   "losses": dict(zip([*VARIANTS, "torch"], loss))}
            rows.append(row)
            print(f"{size:<8} {p:<5} " + " ".join(f"{t:8.3f}" for t in ms) + " "
                  + " ".join(f"{t / ms[-1]:6.2f}x" for t in ms[:-1]) + "  "
                  + " ".join(f"{x:.4f}" for x in loss), flush=True)
            with open(out, "w") as fh:  # after every row: a run cut short keeps what it timed
                json.dump({"machine": machine(), "variants": VARIANTS, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()

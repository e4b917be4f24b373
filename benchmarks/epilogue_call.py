"""Round 7's epilogue device call (issue 36): smallem's captured step with the Linears' GEMM
epilogues and without, PyTorch's best setup in the same precision beside them (CUDA graph, fused
AdamW, SDPA), one process, blocks timed in turn. Variants: "bgrad" (one `linear` node: the bias
added by the product's epilogue, db summed by the weight gradient's, BGRADA), "bias" (the same,
db by a column sum: cuda/linear.py's BGRAD off while that step runs or records), "before" (a
backend of its own without cuda/linear.py's entries: matmul, bias add, column sum, as round 6).

    python benchmarks/epilogue_call.py OUT.json [PRECISIONS] [ROWS]
ROWS: mlp, default (the Transformer's), or a bench_precision.SIZES name (8x512, ...).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from smallem.backends import get_backend
from smallem.backends.cuda import linear
from smallem.backends.cupy import CupyBackend
from smallem.data import load_corpus
from smallem.optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
from smallem.tools.bench import Runner, machine, time_all
from smallem.tools.bench_precision import SIZES, _batches, _torch, step_flops
from smallem.training import registry
from smallem.training.step import make_step

VARIANTS = ("bgrad", "bias", "before")


def smallem_step(model: str, config: Any, precision: str, variant: str) -> tuple:
    be = get_backend("gpu", precision)
    if variant == "before":
        be = CupyBackend(precision)
        del be.fused["linear"], be.fused_forward["linear"]  # nn.Linear records matmul and add
    net = registry.get(model).build(config, be, 0)
    step = make_step(be, net, AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY), capture=True)

    def run(*batch: Any) -> Any:  # the flag as this variant wants it while it runs or records
        kept, linear.BGRAD = linear.BGRAD, (precision,) if variant == "bgrad" else ()
        try:
            return step(*batch)
        finally:
            linear.BGRAD = kept

    return run, be.synchronize, be.item


def main() -> None:
    out = sys.argv[1]
    precisions = (sys.argv[2] if len(sys.argv) > 2 else "tf32,bf16").split(",")
    sizes = (sys.argv[3] if len(sys.argv) > 3 else "mlp,default,8x512").split(",")
    tokens = load_corpus().train
    rows = []
    print("ms per captured step, median of blocks; ratio = smallem / PyTorch in that precision")
    print(f"{'model':<12} {'size':<8} {'prec':<5} " + " ".join(f"{v:>8}" for v in VARIANTS)
          + f" {'PyTorch':>8} {'bgrad':>6} {'bias':>6} {'before':>6} {'TFLOP/s':>8}  losses")
    for size in sizes:
        model = "mlp" if size == "mlp" else "transformer"
        entry = registry.get(model)
        config = entry.bench_config("gpu") if size in ("mlp", "default") else SIZES[size]
        batch = entry.batch if size in ("mlp", "default") else 64
        plan = (50, 500, 50) if size in ("mlp", "default") else (5, 40, 10)
        batches = _batches(model, config, batch, tokens, 0)
        for p in precisions:
            made = [smallem_step(model, config, p, v) for v in VARIANTS]
            made.append(_torch(model, config, p, 0))
            runners = [Runner(step, sync, batches) for step, sync, _ in made]
            time_all(runners, *plan)
            ms = [1e3 * float(np.median(r.seconds)) for r in runners]
            loss = [read(r.loss) for (_, _, read), r in zip(made, runners)]
            tflops = step_flops(model, config, batch) / (ms[0] * 1e-3) / 1e12
            row = {"model": model, "size": "default" if size == "mlp" else size, "precision": p,
                   **{f"{v}_ms": t for v, t in zip(VARIANTS, ms)}, "torch_ms": ms[-1],
                   **{f"ratio_{v}": t / ms[-1] for v, t in zip(VARIANTS, ms)},
                   "tflops_bgrad": tflops, "losses": dict(zip([*VARIANTS, "torch"], loss))}
            rows.append(row)
            print(f"{model:<12} {row['size']:<8} {p:<5} " + " ".join(f"{t:8.3f}" for t in ms)
                  + " " + " ".join(f"{t / ms[-1]:5.2f}x" for t in ms[:-1])
                  + f" {tflops:8.1f}  " + " ".join(f"{x:.4f}" for x in loss), flush=True)
            with open(out, "w") as fh:  # after every row: a run cut short keeps what it timed
                json.dump({"machine": machine(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()

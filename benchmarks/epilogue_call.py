"""Round 7's epilogue device call (issue 36): the Transformer's captured step at the default size
and at 8 × 512 (T 256), smallem with the Linears' GEMM epilogues (one `linear` node: the bias
added by the product, db summed by the weight gradient's product) and without them (a backend
of its own with cuda/linear.py's entries taken out: matmul, bias add, column sum), PyTorch's
best setup in the same precision beside them (CUDA graph, fused AdamW, SDPA), one process.

    python benchmarks/epilogue_call.py OUT.json [PRECISIONS] [SIZES]
"""

from __future__ import annotations

import json
import sys

import numpy as np

from smallem.backends import get_backend
from smallem.backends.cupy import CupyBackend
from smallem.data import load_corpus
from smallem.optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
from smallem.tools.bench import Runner, machine, time_all
from smallem.tools.bench_precision import SIZES, _batches, _torch, step_flops
from smallem.training import registry
from smallem.training.step import make_step


def smallem_step(config, precision: str, epilogues: bool) -> tuple:
    be = get_backend("gpu", precision)
    if not epilogues:
        be = CupyBackend(precision)
        del be.fused["linear"], be.fused_forward["linear"]  # nn.Linear records matmul and add
    net = registry.get("transformer").build(config, be, 0)
    step = make_step(be, net, AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY), capture=True)
    return step, be.synchronize, be.item


def main() -> None:
    out = sys.argv[1]
    precisions = (sys.argv[2] if len(sys.argv) > 2 else "tf32,bf16").split(",")
    sizes = (sys.argv[3] if len(sys.argv) > 3 else "default,8x512").split(",")
    tokens = load_corpus().train
    rows = []
    print(f"{'size':<8} {'prec':<5} {'epilogues':>10} {'no epil.':>9} {'PyTorch':>9} {'ratio':>7} "
          f"{'before':>7} {'TFLOP/s':>8}  loss (epilogues, without, PyTorch)")
    for size in sizes:
        entry = registry.get("transformer")
        config = entry.bench_config("gpu") if size == "default" else SIZES[size]
        batch = entry.batch if size == "default" else 64
        plan = (50, 500, 50) if size == "default" else (5, 40, 10)
        batches = _batches("transformer", config, batch, tokens, 0)
        for p in precisions:
            made = [smallem_step(config, p, True), smallem_step(config, p, False),
                    _torch("transformer", config, p, 0)]
            runners = [Runner(step, sync, batches) for step, sync, _ in made]
            time_all(runners, *plan)
            ms = [1e3 * float(np.median(r.seconds)) for r in runners]
            loss = [read(r.loss) for (_, _, read), r in zip(made, runners)]
            tflops = step_flops("transformer", config, batch) / (ms[0] * 1e-3) / 1e12
            row = {"size": size, "precision": p, "epilogues_ms": ms[0], "without_ms": ms[1],
                   "torch_ms": ms[2], "ratio": ms[0] / ms[2], "ratio_without": ms[1] / ms[2],
                   "tflops": tflops, "loss": loss}
            rows.append(row)
            print(f"{size:<8} {p:<5} {ms[0]:10.3f} {ms[1]:9.3f} {ms[2]:9.3f} {ms[0] / ms[2]:6.2f}x "
                  f"{ms[1] / ms[2]:6.2f}x {tflops:8.1f}  {loss[0]:.4f} {loss[1]:.4f} {loss[2]:.4f}",
                  flush=True)
    with open(out, "w") as fh:
        json.dump({"machine": machine(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()

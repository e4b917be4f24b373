"""Residuals and LayerNorm, trained with and without (lesson 12's claim, measured): the same deep
Transformer trained four ways on the same batches, its blocks' two halves written as
x = x + f(LN(x)) (the package's), without the residual (x = f(LN(x))), without the LayerNorms
(x = x + f(x)), or with neither. Held-out loss at every evaluation, as JSON.
    python benchmarks/ablate_blocks.py [--backend gpu] [--steps 3000] [--json FILE]"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time

from smallem import TrainConfig, train
from smallem.data import load_corpus
from smallem.models import TransformerConfig
from smallem.models.transformer import Block

VARIANTS = {"residuals + LayerNorm": (True, True), "LayerNorm only": (False, True),
            "residuals only": (True, False), "neither": (False, False)}


@contextlib.contextmanager
def blocks(residual: bool, norms: bool):
    """Every Block's forward, with its residual additions and its LayerNorms switched."""
    package = Block.forward

    def forward(self, tape, x):
        a = self.attention(tape, self.attention_norm(tape, x) if norms else x)
        x = x + a if residual else a
        m = self.mlp(tape, self.mlp_norm(tape, x) if norms else x)
        return x + m if residual else m

    Block.forward = Block.__call__ = forward
    try:
        yield
    finally:
        Block.forward = Block.__call__ = package


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--json")
    args = parser.parse_args()
    sizes = TransformerConfig(layers=args.layers, width=64, heads=4, context=64)
    corpus = load_corpus()
    out = {"sizes": dict(vars(sizes)), "steps": args.steps, "batch": args.batch,
           "backend": args.backend, "runs": {}}
    for name, (residual, norms) in VARIANTS.items():
        start = time.perf_counter()
        with blocks(residual, norms):
            run = train(TrainConfig(model="transformer", sizes=sizes, backend=args.backend,
                                    steps=args.steps, batch=args.batch, eval_every=args.steps // 6,
                                    log_every=args.steps // 6), corpus=corpus, log=None, progress=False)
        curve = [(h["step"], h["held_out_loss"]) for h in run.history if h.get("held_out_loss") is not None]
        out["runs"][name] = {"held_out": curve, "held_out_loss": run.held_out_loss,
                             "diverged_at": run.diverged_at, "seconds": time.perf_counter() - start}
        print(f"{name:>22}: held-out {run.held_out_loss:.4f} after {run.steps} steps "
              f"({time.perf_counter() - start:.1f} s)"
              + ("" if math.isfinite(run.held_out_loss) else " diverged"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

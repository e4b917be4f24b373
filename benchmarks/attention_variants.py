"""The fused attention kernels' forward and backward timed apart, per precision, and the float32
kernels under other (G threads per row, ROWS per block) configurations (issue 37's profile):
`python benchmarks/attention_variants.py [json]` on a GPU. B·T = 32,768, 8 heads, causal.
"""

import json
import statistics
import sys

import cupy
import numpy as np

from smallem.autodiff.attention import Attention
from smallem.backends import get_backend
from smallem.backends.cuda import attention

TOKENS, HEADS, REPS = 32_768, 8, 15
# the float32 configurations tried beside the default, per width: (G, ROWS)
OTHERS = {32: [(1, 64), (2, 64)], 64: [(2, 128), (4, 32), (4, 64)], 128: [(4, 32), (8, 16), (8, 32)]}


def timed(fn, reps: int = REPS) -> float:
    """The median of `reps` calls of fn, each timed by device events (after one to warm up)."""
    fn()
    cupy.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def once(precision: str, t: int, d: int) -> None:
    """One forward and one backward (the launches an ncu profile takes)."""
    be = get_backend("gpu", precision)
    q, k, v, g = (cupy.ones((TOKENS // t, HEADS, t, d), dtype=np.float32) for _ in range(4))
    op = Attention(causal=True)
    out = attention.attention_forward(be, q, k, v, op)
    attention.attention_rule(be, g, out, q, k, v, op)
    be.synchronize()


def split(precision: str, t: int, d: int) -> dict:
    """ms of the forward launch and of the backward launches, at (B, H, T, D)."""
    be = get_backend("gpu", precision)
    rng = np.random.default_rng(0)
    q, k, v, g = (cupy.asarray(rng.normal(size=(TOKENS // t, HEADS, t, d)), dtype=np.float32)
                  for _ in range(4))
    op = Attention(causal=True)
    out = attention.attention_forward(be, q, k, v, op)
    fwd = timed(lambda: attention.attention_forward(be, q, k, v, op))
    bwd = timed(lambda: attention.attention_rule(be, g, out, q, k, v, op))
    return {"precision": precision, "T": t, "D": d, "forward_ms": fwd, "backward_ms": bwd,
            "config": list(attention.CONFIG[d]) if precision == "fp32" else "mma.sync"}


def main() -> None:
    rows = []
    for d in (32, 64, 128):
        for t in (1024, 4096):
            for precision in ("fp32", "bf16"):
                rows.append(split(precision, t, d))
                print(rows[-1], flush=True)
    default_config, default_source = dict(attention.CONFIG), attention.SOURCE
    for d, others in OTHERS.items():
        for config in others:
            attention.CONFIG[d] = config
            attention.SOURCE = attention.source({**default_config, d: config})
            for t in (1024, 4096):
                rows.append(split("fp32", t, d))
                print(rows[-1], flush=True)
            attention.CONFIG.update(default_config)
            attention.SOURCE = default_source
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

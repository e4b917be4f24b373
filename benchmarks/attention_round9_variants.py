"""Round 9 (issue 37): the tensor-core attention's variants timed apart against its defaults and
PyTorch's bf16 SDPA (cuDNN, flash) in the same process: without and with the 16-bit copies of
its outputs (`copies`, what the Transformer asks for), the forward with the warp's Q fragments in
registers (QR), 128 query rows on 4 warps of 32 (FlashAttention-2's warps at D 64), 128-key
tiles; the key kernel with K, V fragments in registers (KR), 32-query tiles, two blocks a
multiprocessor. Each variant first checked against float64 (bf16, two small shapes, max of O,
dQ, dK, dV relative errors; the tests' bound is 8·eps = 6.3e-2), then forward and backward
timed apart (eager, device events, median of REPS; B·T = 32,768, 8 heads, causal, bf16).
`CUBINS=DIR python benchmarks/attention_round9_variants.py [json]` (DIR: benchmarks/cubins.py's).
The table of variants is importable without CuPy (attention_round9_registers.py, cubins.py).
"""

import copy
import json
import os
import sys

import numpy as np

from smallem.autodiff.attention import Attention
from smallem.backends import get_backend
from smallem.backends.cuda import attention, attention_mma

TOKENS, HEADS, REPS = 32_768, 8, 10
SHAPES = [(1024, 64), (4096, 64), (1024, 128), (4096, 128)]
if os.environ.get("SHAPES"):  # "T,D T,D ..." (round 9b: D 64 at T 1,024, 2,048, 4,096)
    SHAPES = [tuple(int(x) for x in pair.split(",")) for pair in os.environ["SHAPES"].split()]
DEFAULT = copy.deepcopy(attention_mma.CONFIG)
# name -> {kind: {width: CONFIG's tuple}}: changes from CONFIG
VARIANTS = {
    "fwd QR": {"forward": {64: (8, 64, 1, 1), 128: (8, 64, 1, 1)}},
    # D 128 spills 756 bytes; 128 keys a tile spill 484 at D 64 (attention_round9_registers.py)
    "fwd 4 warps x 32 rows, QR": {"forward": {64: (4, 64, 2, 1)}},
    "fwd 4 warps, 128 keys, QR": {"forward": {64: (4, 128, 1, 1)}},
    "fwd 8 warps, 128 keys, QR": {"forward": {64: (8, 128, 1, 1), 128: (8, 128, 1, 1)}},
    "key KR": {"key": {64: (8, 64, 1, 0), 128: (8, 32, 1, 0)}},
    "key 32 queries": {"key": {64: (8, 32, 0, 0)}},
    "key 32 queries, 2 blocks": {"key": {64: (8, 32, 0, 2)}},
    "key 4 warps, KR": {"key": {64: (4, 64, 1, 0)}},
    # call 2, after call 1 made 4 warps with KR the default at D 64 and KR at D 128
    "key 4 warps, no KR": {"key": {64: (4, 64, 0, 0)}},
    "key 8 warps, no KR (round 8)": {"key": {64: (8, 64, 0, 0), 128: (8, 32, 0, 0)}},
    "key 4 warps, KR, 32 queries": {"key": {64: (4, 32, 1, 0), 128: (4, 32, 1, 0)}},
    "key 4 warps, KR, 3 blocks": {"key": {64: (4, 64, 1, 3)}},
    "key 4 warps, 32 queries, 4 blocks": {"key": {64: (4, 32, 0, 4)}},
    # round 9b: keyq by FlashAttention-2's 2-D warp tiling (attention_mma_grad2d.py), 2 x 2 warps
    "key 2-D tiled, KR": {"key": {64: (4, 64, 1, 0)}, "tiled": {64: 1}},
    "key 2-D tiled, no KR": {"key": {64: (4, 64, 0, 0)}, "tiled": {64: 1}},
    "key 2-D tiled, 8 warps (128 keys), KR": {"key": {64: (8, 64, 1, 0)}, "tiled": {64: 1}},
}


def configured(change: dict) -> dict:
    cfg = copy.deepcopy(DEFAULT)
    for kind, widths in change.items():
        cfg[kind].update(widths)
    return cfg


def widths(change: dict) -> tuple:
    return tuple(sorted({d for w in change.values() for d in w}))


def split(t: int, d: int, copies: bool) -> tuple[float, float]:
    """(forward ms, backward ms) as attention.py runs them (heads views of (B, T, H, D) arrays,
    as the Transformer's), with or without the 16-bit copies."""
    import attention_variants  # benchmarks/: the event timer
    import cupy

    be = get_backend("gpu", "bf16")
    rng = np.random.default_rng(0)
    q, k, v, g = (cupy.asarray(rng.normal(size=(TOKENS // t, t, HEADS, d)), dtype=np.float32)
                  .transpose(0, 2, 1, 3) for _ in range(4))
    op = Attention(causal=True, copies=copies)
    out = attention.attention_forward(be, q, k, v, op)
    fwd = attention_variants.timed(lambda: attention.attention_forward(be, q, k, v, op), REPS)
    bwd = attention_variants.timed(lambda: attention.attention_rule(be, g, out, q, k, v, op), REPS)
    return fwd, bwd


def main() -> None:
    import attention_mma_variants as base  # benchmarks/: float64 errors, PyTorch's rows, the row format

    if os.environ.get("CUBINS"):
        import cubins

        cubins.install(os.environ["CUBINS"])
    only = os.environ.get("ONLY")  # a ";"-separated subset of VARIANTS (call 2)
    plain = os.environ.get("PLAIN") == "1"  # round 9b: the defaults without copies only
    rows = []
    for t, d in SHAPES:
        if not only:
            for b in ("cudnn", "flash"):
                rows.append(base.row(f"torch {b}", t, d, *base.torch_split(t, d, b)))
        for copies in (False,) if plain else (False, True):
            err = base.errors(d) + base.errors(d, 70, 130, False) if not copies else None
            rows.append(base.row(f"defaults{', copies' if copies else ''}", t, d, *split(t, d, copies), err))
    for name, change in VARIANTS.items():
        if only and name not in only.split(";"):
            continue
        for kind in DEFAULT:
            attention_mma.CONFIG[kind].update(configured(change)[kind])
        for t, d in SHAPES:
            if d in widths(change):
                err = base.errors(d) + base.errors(d, 70, 130, False)
                rows.append(base.row(name, t, d, *split(t, d, False), err))
        for kind in DEFAULT:
            attention_mma.CONFIG[kind].update(DEFAULT[kind])
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""Round 10 (issue 37): the ways the tensor-core attention's key kernel adds dQ (CONFIG["dq"],
attention_mma_dq.py: float2 atomics, red.global.add.v4.f32, bulk reduce-adds from shared memory),
in today's keyq and the 2-D tiled one (CONFIG["tiled"]), beside dQ by its own pass (no atomics).
Per shape the inputs are made once and every variant, first checked against float64 (bf16, two
small shapes, max of O, dQ, dK, dV relative errors; the tests' bound is 8·eps = 6.3e-2), has its
forward and backward timed apart: device events around REPS back-to-back calls (the queue stays
full: no host gaps), the median of ROUNDS such means; today's config again last (the drift).
`CUBINS=DIR python benchmarks/attention_round10_variants.py [json]`, on the device; importable
without CuPy (benchmarks/cubins.py compiles VARIANTS' modules ahead). Round 11 removed the ways
of adding dQ but float2 atomics, and dQ by its own pass (results/round10/attention_bwd.md); the
machinery stays (r11_attnbwd_variants.py runs it with its own VARIANTS).
"""

import copy
import json
import os
import statistics
import sys

import numpy as np

from smallem.autodiff.attention import Attention
from smallem.backends import get_backend
from smallem.backends.cuda import attention, attention_mma

TOKENS, HEADS, REPS, ROUNDS = 32_768, 8, 10, 5
SHAPES = [(1024, 64), (2048, 64), (4096, 64), (1024, 128), (4096, 128)]
if os.environ.get("SHAPES"):  # "T,D T,D ..."
    SHAPES = [tuple(int(x) for x in pair.split(",")) for pair in os.environ["SHAPES"].split()]
DEFAULT = copy.deepcopy(attention_mma.CONFIG)
# name -> {kind: {width: CONFIG's entry}}: changes from CONFIG. Round 11 removed the ways of adding
# dQ other than float2 atomics (CONFIG["dq"]) and dQ by its own pass; the variants left run today's
# kernels (and tiled's, the default since round 10's merge).
VARIANTS = {
    "today (float2 atomics)": {"tiled": {64: 0}, "key_wg": {64: 0}},
    "tiled": {"tiled": {64: 1}, "key_wg": {64: 0}},
}


def configured(change: dict) -> dict:
    cfg = copy.deepcopy(DEFAULT)
    for kind, widths in change.items():
        cfg[kind].update(widths)
    return cfg


def applies(change: dict, d: int) -> bool:
    """A variant runs at the widths it changes (every width where it changes nothing)."""
    return all(d in widths for widths in change.values())


def use(name: str) -> None:
    """CONFIG as variant `name` has it."""
    cfg = configured(VARIANTS[name])
    for kind in cfg:
        attention_mma.CONFIG[kind] = cfg[kind]


def timed(fn) -> float:
    """ms a call: the median over ROUNDS of the mean of REPS calls between two events."""
    import cupy

    fn()
    cupy.cuda.get_current_stream().synchronize()
    means = []
    for _ in range(ROUNDS):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(REPS):
            fn()
        end.record()
        end.synchronize()
        means.append(cupy.cuda.get_elapsed_time(start, end) / REPS)
    return statistics.median(means)


def shape_rows(t: int, d: int, names: list) -> list:
    """The rows of the variants `names` that apply at (T, D), today's config again last."""
    import attention_mma_variants as base  # benchmarks/: float64 errors, the row format
    import cupy

    be, rows = get_backend("gpu", "bf16"), []
    cupy.random.seed(t + d)
    q, k, v, g = (cupy.random.standard_normal((TOKENS // t, t, HEADS, d), dtype=np.float32)
                  .transpose(0, 2, 1, 3) for _ in range(4))  # heads views, as the Transformer's
    op = Attention(causal=True)
    for name in names + [names[0]]:
        if not applies(VARIANTS[name], d):
            continue
        use(name)
        err = base.errors(d) + base.errors(d, 70, 130, False)
        if max(err) > 6.3e-2:
            print(f"{name}: T={t} D={d} errors {err}: not timed", flush=True)
            rows.append({"impl": name, "T": t, "D": d, "errors": err})
            continue
        out = attention.attention_forward(be, q, k, v, op)
        fwd = timed(lambda: attention.attention_forward(be, q, k, v, op))
        bwd = timed(lambda: attention.attention_rule(be, g, out, q, k, v, op))  # noqa: B023 - timed now
        rows.append(base.row(name, t, d, fwd, bwd, err))
    use(names[0])
    return rows


def main() -> None:
    import cupy

    if os.environ.get("CUBINS"):
        import cubins

        cubins.install(os.environ["CUBINS"])
    only = [n for n in os.environ.get("ONLY", "").split(";") if n]
    names = [n for n in VARIANTS if not only or n in only]
    rows = []
    for t, d in SHAPES:
        rows += shape_rows(t, d, names)
        cupy.get_default_memory_pool().free_all_blocks()
        if len(sys.argv) > 1:
            with open(sys.argv[1], "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""Round 14's bf16 attention call (issue 37, branch r14-bf16): the forward stores the 16-bit Q rows it
rounds anyway, and the backward's key kernel reads them, so the backward converts dO alone (δ and
dQ's zeros in that pass) where it converted Q too. Run by benchmarks/r14-bf16_device.sh:

    python benchmarks/r14_bf16.py nvrtc                registers, local bytes (NVRTC, sm_90a)
    python benchmarks/r14_bf16.py broken               the new test against kernels broken on purpose
    python benchmarks/r14_bf16.py bench OUT.json       bench_attention's D 64 bf16 rows, then "before"
    python benchmarks/r14_bf16.py step OUT.json        the captured bf16 step at 8 x 512: after, before,
                                                       PyTorch's (blocks in turn, one process)

"before" (same process, after the rows): the forward's Q rows dropped before the backward sees them,
so that it converts Q as main did; the forward still stores them, so this is at most main's time
plus those stores (an upper bound on what main took: the gain it shows is at most the real one).

Round 15 (branch r15-bf16): the long-sequence forward's ring refilled with warpgroup 0 waiting
(ptxas' C7520 gone; call 1 tried a producer warp). With BEFORE=FILE (round 14's
attention_mma_forward_wgq.py: `git show 2945e7d:smallem/backends/cuda/attention_mma_forward_wgq.py`),
`bench` times, after the rows, R15_VARIANTS, round 14's forward (thread 0 refills the ring) and this
one again in the same process; `broken` includes the refill filling a wrong tile (ONLY: a part of
the names to run).
"""

from __future__ import annotations

import json
import os
import sys

import cubins  # benchmarks/

from smallem.backends.cuda import attention_mma

# name -> (attention_mma's attribute, the text, what replaces it, the test that must fail)
KEEPS = "tests/test_attention_fused_gpu.py::test_the_forward_keeps_q_s_rows_as_q_s_convert_makes_them"
BREAKS = {
    "wgq: every 61st kept row not stored": (
        "KERNELS_WGQ", "if (keep && in) *(uint2*)", "if (keep && in && (first + j) % 61) *(uint2*)",
        KEEPS + "[2049-64-True-bf16]"),
    "round 10's forward: a kept row's halves swapped": (
        "TILES", "(keep + (long long)(first + j) * HD + c) = r;",
        "(keep + (long long)(first + j) * HD + c) = make_uint2(r.y, r.x);",
        KEEPS + "[300-64-False-bf16]"),
    "wgq's refill: tile 5 of every item filled with tile 4": (
        "KERNELS_WGQ", "wgq_fill<N, NB>(kv, kb, vb, j + AHEAD, base + j + AHEAD",
        "wgq_fill<N, NB>(kv, kb, vb, j + AHEAD - (j + AHEAD == 5), base + j + AHEAD",
        "tests/test_attention_fused_gpu.py::test_the_long_sequences_forward_matches_float64"
        "[1-1000-1000-2-64-True-bf16]"),
}
# round 15: CONFIG changes timed beside the default in one process (bench)
R15_VARIANTS = {"from T 1,024": ("forward_wg_from", {64: 1024}),
                "4 stages (the refill 2 tiles behind)": ("forward_wg", {64: (8, 64, 4, 2)})}


def nvrtc() -> None:
    """The D 64 modules as a user's run compiles them (no cubins: SM90A auto, NVRTC's sm_90a)."""
    print("SM90A", attention_mma.SM90A, "->", attention_mma.sm90a(), flush=True)
    for copies in (False, True):
        for kind in ("forward", "forwardwg", "keyq", "keyq_lf", "convert", "convertsw"):
            fn = attention_mma.mma_kernel(kind, "bf16", 64, copies)
            print(f"copies {copies}: {kind} bf16 64 by NVRTC: {fn.num_regs} registers, "
                  f"{fn.local_size_bytes} local bytes", flush=True)


def broken() -> None:
    import pytest

    for name, (attr, old, new, test) in BREAKS.items():
        if os.environ.get("ONLY", "") not in name:  # ONLY: a part of the names to run
            continue
        kept = getattr(attention_mma, attr)
        assert old in kept, name
        setattr(attention_mma, attr, kept.replace(old, new))
        attention_mma._source.cache_clear()
        try:
            rc = pytest.main(["-o", "addopts=", "-p", "no:cacheprovider", "-q", "-s", test])
        finally:
            setattr(attention_mma, attr, kept)
            attention_mma._source.cache_clear()
        print(f"BROKEN {name!r}: pytest rc {int(rc)} ->", "failed, as it must" if rc == 1 else "NOT FAILED",
              flush=True)


def before(be) -> None:
    """be's fused attention as main's backward ran it: the forward's Q rows dropped (Q converted)."""
    forward = be.fused_forward["attention"]

    def dropped(*args):
        got = forward(*args)
        args[-1].saved = args[-1].saved[:1]
        return got

    be.fused_forward["attention"] = dropped


def round14_forward(path: str) -> None:
    """Round 14's long-sequence forward (thread 0 waits on `empty` and refills the ring: C7520) in
    place of this round's, from its module file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("wgq_round14", path)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    attention_mma.KERNELS_WGQ, attention_mma.wgq_entries = old.KERNELS_WGQ, old.wgq_entries
    attention_mma._source.cache_clear()


def step(out: str) -> None:
    import numpy as np

    from smallem.backends.cupy import CupyBackend
    from smallem.data import load_corpus
    from smallem.optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
    from smallem.tools.bench import Runner, machine, time_all
    from smallem.tools.bench_precision import SIZES, _batches, _torch
    from smallem.training import registry
    from smallem.training.step import make_step

    config = SIZES["8x512"]
    batches = _batches("transformer", config, 64, load_corpus().train, 0)
    made = []
    for old in (False, True):
        be = CupyBackend("bf16")
        if old:
            before(be)
        net = registry.get("transformer").build(config, be, 0)
        made.append((make_step(be, net, AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY), capture=True),
                     be.synchronize, be.item))
    made.append(_torch("transformer", config, "bf16", 0))
    runners = [Runner(s, sync, batches) for s, sync, _ in made]
    time_all(runners, 4, 20, 8)
    ms = [1e3 * float(np.median(r.seconds)) for r in runners]
    losses = [float(read(r.loss)) for (_, _, read), r in zip(made, runners)]
    row = {"size": "8x512", "precision": "bf16", "after_ms": ms[0], "before_ms": ms[1], "torch_ms": ms[2],
           "losses": losses, "machine": machine()}
    print(json.dumps(row), flush=True)
    json.dump(row, open(out, "w"), indent=1)


def bench(out: str) -> None:
    from smallem.tools import bench_attention as b
    from smallem.tools.bench import machine

    found = {"device": "gpu", "machine": machine()}
    found["after"] = b.attention_rows("gpu", True, print, (64,), (1024, 2048, 4096), ("bf16",))
    json.dump(found, open(out, "w"), indent=1)
    if os.environ.get("BEFORE"):  # round 15: the variants, round 14's forward, this one again
        import copy

        def rows() -> list:
            return b.attention_rows("gpu", False, print, (64,), (1024, 2048, 4096), ("bf16",))

        kept = copy.deepcopy(attention_mma.CONFIG)
        for name, (key, value) in R15_VARIANTS.items():
            attention_mma.CONFIG[key] = value
            print(f"=== {name}", flush=True)
            found[name] = rows()
            attention_mma.CONFIG[key] = kept[key]
            json.dump(found, open(out, "w"), indent=1)
        ours = attention_mma.KERNELS_WGQ, attention_mma.wgq_entries
        round14_forward(os.environ["BEFORE"])
        print("=== round 14's forward (main: thread 0 refills the ring)", flush=True)
        found["round 14's forward"] = rows()
        json.dump(found, open(out, "w"), indent=1)
        attention_mma.KERNELS_WGQ, attention_mma.wgq_entries = ours
        attention_mma._source.cache_clear()
        print("=== after, again", flush=True)
        found["after, again"] = rows()
        json.dump(found, open(out, "w"), indent=1)
        return
    from smallem.backends import get_backend

    before(get_backend("gpu", "bf16"))  # the backend bench_attention gets (cached)
    print("=== before (Q converted in the backward)", flush=True)
    found["before"] = b.attention_rows("gpu", False, print, (64,), (1024, 2048, 4096), ("bf16",))
    json.dump(found, open(out, "w"), indent=1)


if __name__ == "__main__":
    if os.environ.get("CUBINS"):
        cubins.install(os.environ["CUBINS"])
    {"nvrtc": nvrtc, "broken": broken, "bench": bench, "step": step}[sys.argv[1]](*sys.argv[2:])

"""Round 13 (issue 37, branch r13-fwd): the forward of CONFIG["forward_wg"] (Q from shared
memory, the K/V ring by bulk copies on mbarriers; attention_mma_forward_wgq.py) against round 10's
wgmma forward, D 64, bf16, causal, 8 heads, B·T 32,768. (The 128-key tiles and the persistent
grid, measured slower in the calls, were removed: commit 7509569 of branch r13-fwd has the 12-warp,
128-key form with its persistent switch.)
Stages (argv[1]):
  build DIR   the broken kernels' cubins (BREAKS) into DIR (benchmarks/cubins.py builds the rest)
  time [json] forward alone and forward + backward, captured (attention_round10.timings), for
              each of VARIANTS (the new forward from T 0; never: round 10's), each T of LENGTHS
  broken      the new forward's float64 test against each BREAKS kernel: each must fail
  check       that test (bf16) under each of VARIANTS' tiles (ONLY: those named, ';' between)
  once NAME   two forwards at T 4,096 (for ncu), NAME one of VARIANTS
`CUBINS=DIR python benchmarks/r13_fwd.py STAGE ...`
"""

import json
import os
import sys

from smallem.backends.cuda import attention_mma

LENGTHS = tuple(int(x) for x in os.environ.get("LENGTHS", "1024 2048 4096").split())
# name -> (CONFIG["forward_wg_from"][64], CONFIG["forward_wg"][64]): the tiles (warps, keys,
# stages, blocks a multiprocessor) of the variants
SHIPPED = attention_mma.CONFIG["forward_wg"][64]
VARIANTS = {"round 10": (10**9, SHIPPED), "8w 64k 2 blocks": (0, (8, 64, 3, 2)),
            "4w 64k 4 blocks": (0, (4, 64, 2, 4)), "8w 64k 2 stages": (0, (8, 64, 2, 2)),
            "8w 64k 4 stages": (0, (8, 64, 4, 2))}
TILES = [tile for name, (_, tile) in VARIANTS.items() if name != "round 10"]
ONLY = os.environ.get("ONLY", "").split(";") if os.environ.get("ONLY") else list(VARIANTS)


def use(name: str) -> None:
    first, tile = VARIANTS[name]
    attention_mma.CONFIG["forward_wg_from"][64] = first
    attention_mma.CONFIG["forward_wg"][64] = tile
# name -> (module attribute of the CUDA text, old, new): each breaks the new forward alone
BREAKS = {
    "K, V rows not swizzled by the convert": ("TILES", "(SW ? ((c >> 3) ^ (row & 7)) << 3 : c)", "c"),
    "the last P V dropped": ("KERNELS_WGQ", "    if (mine == tiles) {", "    if (0) {"),
    "the causal mask one key late": ("KERNELS_WG", "(causal && key > row)) s[i][e] = NEG_INF;",
                                     "(causal && key > row + 1)) s[i][e] = NEG_INF;"),
}
BROKEN_TEST = "tests/test_attention_fused_gpu.py::test_the_long_sequences_forward_matches_float64"


def use_broken(name: str | None) -> None:
    """The module's CUDA text with BREAKS[name] applied (None: as shipped)."""
    from smallem.backends.cuda import attention_mma_forward_wg, attention_mma_forward_wgq, attention_mma_tiles

    shipped = {"TILES": attention_mma_tiles.TILES, "KERNELS_WGQ": attention_mma_forward_wgq.KERNELS_WGQ,
               "KERNELS_WG": attention_mma_forward_wg.KERNELS_WG}
    for attr, text in shipped.items():
        setattr(attention_mma, attr, text)
    if name:
        attr, old, new = BREAKS[name]
        assert old in shipped[attr], name
        setattr(attention_mma, attr, shipped[attr].replace(old, new))
    attention_mma._source.cache_clear()


def build(folder: str) -> None:
    import cubins  # benchmarks/

    sources = set()
    for name in BREAKS:
        use_broken(name)
        sources |= {attention_mma.source(attention_mma.CONFIG, (f,), (64,), copies)
                    for f in attention_mma.FORMATS for copies in (False, True)}
    use_broken(None)
    for tile in TILES:  # the variants' modules (their float64 tests: both formats, copies or not)
        attention_mma.CONFIG["forward_wg"][64] = tile
        sources |= {attention_mma.source(attention_mma.CONFIG, (f,), (64,), copies)
                    for f in attention_mma.FORMATS for copies in (False, True)}
    attention_mma.CONFIG["forward_wg"][64] = SHIPPED
    cubins.compile_all(folder, sources)


def time(path: str | None) -> None:
    import attention_round10 as r10  # benchmarks/

    rows = []
    for t in LENGTHS:
        for name in ONLY:
            use(name)
            fwd, both = r10.timings(t, 64)
            rows.append({"impl": name, "T": t, "forward_ms": fwd, "fwd_bwd_ms": both})
            print(f"T {t:5d} {name:20s} forward {fwd:.4f} ms, forward + backward {both:.4f} ms", flush=True)
    if path:
        json.dump(rows, open(path, "w"), indent=1)


def broken() -> None:
    import pytest

    for name in BREAKS:
        use_broken(name)
        rc = pytest.main(["-o", "addopts=", "-p", "no:cacheprovider", "-q", "-x", "-k", "bf16", BROKEN_TEST])
        print(f"BROKEN {name!r}: pytest rc {int(rc)} ->", "failed, as it must" if rc == 1 else "NOT FAILED",
              flush=True)
    use_broken(None)


def best(path: str) -> str:
    """The variant of the time stage's json (`path`) with the least forward summed over T ≥ 2,048,
    round 10's excluded."""
    rows = [r for r in json.load(open(path)) if r["impl"] != "round 10" and r["T"] >= 2048]
    total: dict = {}
    for r in rows:
        total[r["impl"]] = total.get(r["impl"], 0.0) + r["forward_ms"]
    print("forward ms summed over T >= 2,048:", {n: round(x, 4) for n, x in total.items()}, flush=True)
    return min(total, key=total.get)


def check() -> None:
    """The new forward's float64 test (bf16) under each variant's tiles: a variant timed is a
    correct one."""
    import pytest

    for name in ONLY:
        if name != "round 10":
            use(name)
            rc = pytest.main(["-o", "addopts=", "-p", "no:cacheprovider", "-q", "-k", "bf16", BROKEN_TEST])
            print(f"CHECK {name!r}: pytest rc {int(rc)}", flush=True)
    use("8w 64k 2 blocks")


def once(name: str) -> None:
    import cupy

    from smallem.autodiff.attention import Attention
    from smallem.backends import get_backend
    from smallem.backends.cuda import attention

    use(name)
    be = get_backend("gpu", "bf16")
    q, k, v = (cupy.random.standard_normal((8, 8, 4096, 64), dtype=cupy.float32) for _ in range(3))
    for _ in range(2):
        attention.attention_forward(be, q, k, v, Attention(causal=True))
    cupy.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    if os.environ.get("CUBINS"):
        import cubins  # benchmarks/

        cubins.install(os.environ["CUBINS"])
    stage, rest = sys.argv[1], sys.argv[2:]
    {"build": lambda: build(rest[0]), "time": lambda: time(rest[0] if rest else None), "broken": broken,
     "check": check, "once": lambda: once(rest[0])}[stage]()

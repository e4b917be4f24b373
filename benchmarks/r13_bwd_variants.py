"""Round 13 (issue 37, branch r13-bwd): the wgmma key kernel's variants at D 64, bf16, causal, B·T
32,768, 8 heads. Calls 1 and 2 measured 1, 2 or 3 warpgroups of 64 keys a block (2, 3 sharing each
Q, dO tile, FlashAttention-3's consumer warpgroups), the grid heads first (LF) at every T or not, and
overlaps inside a warpgroup (results/round13/bwd/bwd.md); the losers are gone, and VARIANTS is call
3's. attention_round10_variants.py's machinery with these VARIANTS (each checked against float64
first, then forward and backward timed apart; the first again last).
BREAKS: the kernel broken on purpose, for the device call's `broken` stage
(benchmarks/r13-bwd_device.sh; its GPU test must fail there). `CUBINS=DIR python
benchmarks/r13_bwd_variants.py [json]` on the device; `python benchmarks/r13_bwd_variants.py --build
DIR` here compiles the broken modules' cubins (benchmarks/cubins.py builds the variants' with
`variants`).
"""

import copy
import sys

from smallem.backends.cuda import attention_mma

DEFAULT = copy.deepcopy(attention_mma.CONFIG)
VARIANTS = {  # call 3 (calls 1, 2's losers gone): the default, timed from cubins and from NVRTC
    "default": {},
}
# name -> (text in attention_mma_grad_wg.py, its broken replacement (every occurrence), the test's
# CONFIG changes, the GPU test that must then fail). Call 2's "dQ added before its product is done"
# (OV 2's wait left out) passed: ptxas waits for an unfinished wgmma's registers itself.
TEST = ("tests/test_attention_fused_gpu.py::"
        "test_the_wgmma_key_kernel_matches_float64[1-600-600-3-64-True-0-0-bf16]")
BREAKS = {
    "dV from Q": ("(&dv[0][0], pd + 2 * kc, gd + 128 * kc, 1)",
                  "(&dv[0][0], pd + 2 * kc, qd + 128 * kc, 1)", {}, TEST),
    "causal mask one key late": ("s[i][e] = edge && key > i0 + col ? 0.f : p;",
                                 "s[i][e] = edge && key > i0 + col + 1 ? 0.f : p;", {}, TEST),
    "dQ added a row late": ("dq_add<1, DT>(dq, dz, sdz, b, h, i0 + r0, 0, T, scale);",
                            "dq_add<1, DT>(dq, dz, sdz, b, h, i0 + r0 + 1, 0, T, scale);", {}, TEST),
    "dS with the wrong query's δ": ("(dp[i][e] - dt[i * 8 + t * 2 + (e & 1)])",
                                    "(dp[i][e] - dt[i * 8 + t * 2])", {}, TEST),
}


def configured(change: dict) -> dict:
    cfg = copy.deepcopy(DEFAULT)
    for kind, widths in change.items():
        cfg[kind].update(widths)
    return cfg


def use_broken(name: str) -> None:
    """attention_mma's modules with the wgmma keyq broken as BREAKS[name] says."""
    from smallem.backends.cuda import attention_mma_grad_wg as wg

    old, new, _, _ = BREAKS[name]
    assert old in wg.KERNELS_BACKWARD_WG, name
    attention_mma.KERNELS_BACKWARD_WG = wg.KERNELS_BACKWARD_WG.replace(old, new)
    attention_mma._source.cache_clear()


def broken_sources() -> set:
    """The module each break's test compiles (as the test configures it)."""
    from smallem.backends.cuda import attention_mma_grad_wg as wg

    out = set()
    for name, (_, _, change, _) in BREAKS.items():
        use_broken(name)
        cfg = configured({"key": {64: (4, 64, 1, 0)}, "key_lf": {64: 0},
                          **{kind: {64: value} for kind, value in change.items()}})
        cfg["staged"] = {w: (0, 0) for w in attention_mma.WIDTHS}
        out |= {attention_mma.source(cfg, ("bf16",), (64,), copies) for copies in (False, True)}
    attention_mma.KERNELS_BACKWARD_WG = wg.KERNELS_BACKWARD_WG
    attention_mma._source.cache_clear()
    return out


def build(folder: str) -> None:
    import cubins  # benchmarks/

    sources = broken_sources()
    cubins.compile_all(folder, sources)
    print(f"{len(BREAKS)} breaks, {len(sources)} broken modules in {folder}")


def main() -> None:
    import attention_round10_variants as rv  # benchmarks/

    rv.VARIANTS, rv.DEFAULT = VARIANTS, DEFAULT  # its use(), applies(), shape_rows() read these
    rv.SHAPES = [(t, 64) for t in (1024, 2048, 4096)]
    rv.main()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--build"]:
        build(sys.argv[2])
    else:
        main()

"""Round 13 (issue 37, branch r13-bwd): the wgmma key kernel with 1, 2 or 3 warpgroups of 64 keys a
block (CONFIG["key_wg"]; 2, 3 share each Q, dO tile, FlashAttention-3's consumer warpgroups), its
grid heads first (LF) at every T or not, at D 64, bf16, causal, B·T 32,768, 8 heads.
attention_round10_variants.py's machinery with these VARIANTS (each checked against float64 first,
then forward and backward timed apart; today's again last). BREAKS: the kernel broken on purpose,
for the device call's `broken` stage (benchmarks/r13-bwd_device.sh; its GPU test must fail there).
`CUBINS=DIR python benchmarks/r13_bwd_variants.py [json]` on the device; `python
benchmarks/r13_bwd_variants.py --build DIR` here compiles the broken modules' cubins
(benchmarks/cubins.py builds the variants' with `variants`).
"""

import copy
import sys

import r11_attnbwd_variants as v11  # benchmarks/: the build of broken modules, once()

from smallem.backends.cuda import attention_mma

DEFAULT = copy.deepcopy(attention_mma.CONFIG)
VARIANTS = {
    "wg1 (round 11)": {"key_wg": {64: 1}, "key_lf": {64: 0}},
    "wg1, LF": {"key_wg": {64: 1}, "key_lf": {64: 1}},
    "wg2": {"key_wg": {64: 2}, "key_lf": {64: 0}},
    "wg2, LF": {"key_wg": {64: 2}, "key_lf": {64: 1}},
    "wg3": {"key_wg": {64: 3}, "key_lf": {64: 0}},
    "wg3, LF": {"key_wg": {64: 3}, "key_lf": {64: 1}},
    "default": {},
}
# name -> (text in attention_mma_grad_wg.py, its broken replacement (every occurrence), the
# CONFIG["key_wg"] whose test must then fail)
BREAKS = {
    "dV from Q": ("(&dv[0][0], pd + 2 * kc, gd + 128 * kc, 1)",
                  "(&dv[0][0], pd + 2 * kc, qd + 128 * kc, 1)", 1),
    "causal mask one key late": ("if (edge && key > i0 + col) p = 0.f;",
                                 "if (edge && key > i0 + col + 1) p = 0.f;", 1),
    "every warpgroup reads the first one's K": ("kd = sw128(ksw + grp * TILE)", "kd = sw128(ksw)", 3),
    "a warpgroup idle a tile early": ("!(causal && i0 + N <= kg)", "!(causal && i0 + N <= kg + 64)", 3),
}
BROKEN_TEST = ("tests/test_attention_fused_gpu.py::"
               "test_the_wgmma_key_kernel_matches_float64[1-600-600-3-64-True-{}-0-0-bf16]")


def configured(change: dict) -> dict:
    cfg = copy.deepcopy(DEFAULT)
    for kind, widths in change.items():
        cfg[kind].update(widths)
    return cfg


def main() -> None:
    import attention_round10_variants as rv  # benchmarks/

    rv.VARIANTS, rv.DEFAULT = VARIANTS, DEFAULT  # its use(), applies(), shape_rows() read these
    rv.SHAPES = [(t, 64) for t in (1024, 2048, 4096)]
    rv.main()


if __name__ == "__main__":
    # its use_broken(), broken_sources(), build(), with the broken test's config (no LF twin)
    v11.BREAKS, v11.BROKEN_TEST, v11.DEFAULT = BREAKS, BROKEN_TEST, configured({"key_lf": {64: 0}})
    if sys.argv[1:2] == ["--build"]:
        v11.build(sys.argv[2])
    else:
        main()

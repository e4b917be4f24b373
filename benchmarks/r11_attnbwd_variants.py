"""Round 11 (issue 37, branch r11-attnbwd): keyq by wgmma (CONFIG["key_wg"], attention_mma_grad_wg.py)
beside today's default (the 2-D tiled mma.sync keyq), at D 64, bf16, causal, B·T 32,768, 8 heads.
attention_round10_variants.py's machinery with these VARIANTS: per shape every variant is first
checked against float64 (bf16, two small shapes; bound 8·eps = 6.3e-2), then its forward and
backward timed apart (device events around 10 back-to-back calls, median of 5), today's again last.
BREAKS: the wgmma kernel broken on purpose, for the device call's `broken` stage (its GPU test must
fail there). `CUBINS=DIR python benchmarks/r11_attnbwd_variants.py [json]` on the device;
`python benchmarks/r11_attnbwd_variants.py --build DIR` here compiles the broken modules' cubins
(benchmarks/cubins.py builds the variants' with `variants`).
"""

import copy
import subprocess
import sys
import tempfile
from pathlib import Path

from smallem.backends.cuda import attention_mma

DEFAULT = copy.deepcopy(attention_mma.CONFIG)
VARIANTS = {  # call 1 ran them with CONFIG["key_wg"][64] = 0, this first one as "tiled (default)", {}
    "tiled (round 10)": {"key_wg": {64: 0}},
    "key wgmma": {"key_wg": {64: 1}},
    "key wgmma, LF": {"key_wg": {64: 1}, "key_lf": {64: 1}},
    "key+dQ wgmma": {"key_wg": {64: 2}},
    "all wgmma from smem": {"key_wg": {64: 3}},
    "all wgmma from smem, 3 blocks": {"key_wg": {64: 3}, "key": {64: (4, 64, 1, 3)}},
    "all wgmma from smem, 3 blocks, LF": {"key_wg": {64: 3}, "key": {64: (4, 64, 1, 3)}, "key_lf": {64: 1}},
    "default": {},  # round 11's, after call 1: "all wgmma from smem"
}
# name -> (text in attention_mma_grad_wg.py's kernels, its broken replacement (every occurrence), the
# CONFIG["key_wg"] way whose test must then fail)
BREAKS = {
    "dK from dO": ("wg_pv<F16>(dk, df, sw128(qs));", "wg_pv<F16>(dk, df, sw128(gs));", 1),
    "causal mask one key late": ("if (edge && key > i0 + col) p = 0.f;",
                                 "if (edge && key > i0 + col + 1) p = 0.f;", 1),
    "dQ's wgmma a key chunk short": ("for (int kc = 0; kc < M / 16; ++kc)  // 16 keys",
                                     "for (int kc = 0; kc < M / 16 - 1; ++kc)  // 16 keys", 2),
    "dV from Q (smem)": ("(&dv[0][0], pd + 2 * kc, gd + 128 * kc, 1)",
                         "(&dv[0][0], pd + 2 * kc, qd + 128 * kc, 1)", 3),
    "causal mask one key late (smem)": ("if (edge && key > i0 + col) p = 0.f;",
                                        "if (edge && key > i0 + col + 1) p = 0.f;", 3),
}
# the GPU test a break must fail: bf16, (1, 600, 600, 3, 64, causal), registers uncapped, the way
BROKEN_TEST = ("tests/test_attention_fused_gpu.py::"
               "test_the_wgmma_key_kernel_matches_float64[1-600-600-3-64-True-{}-0-0-bf16]")


def configured(change: dict) -> dict:
    cfg = copy.deepcopy(DEFAULT)
    for kind, widths in change.items():
        cfg[kind].update(widths)
    return cfg


def use_broken(name: str) -> None:
    """attention_mma's modules with the wgmma keyq broken as BREAKS[name] says."""
    from smallem.backends.cuda import attention_mma_grad_wg as wg

    old, new, _ = BREAKS[name]
    assert old in wg.KERNELS_BACKWARD_WG, name
    attention_mma.KERNELS_BACKWARD_WG = wg.KERNELS_BACKWARD_WG.replace(old, new)
    attention_mma._source.cache_clear()


def broken_sources() -> set:
    """The module the broken test compiles, for each break (as the test configures it)."""
    from smallem.backends.cuda import attention_mma_grad_wg as wg

    cfg = copy.deepcopy(DEFAULT)
    cfg["key"][64] = (4, 64, 1, 0)
    cfg["staged"] = {w: (0, 0) for w in attention_mma.WIDTHS}
    out = set()
    for name, (_, _, way) in BREAKS.items():
        use_broken(name)
        cfg["key_wg"][64] = way
        out.add(attention_mma.source(cfg, ("bf16",), (64,), False))
    attention_mma.KERNELS_BACKWARD_WG = wg.KERNELS_BACKWARD_WG
    attention_mma._source.cache_clear()
    return out


def build(folder: str) -> None:
    import cubins  # benchmarks/

    for source in broken_sources():
        with tempfile.TemporaryDirectory() as tmp:
            cu = Path(tmp) / "k.cu"
            cu.write_text(source)
            target = Path(folder) / cubins.name(source)
            subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-o", str(target), str(cu)], check=True)
    print(f"{len(BREAKS)} broken modules in {folder}")


def once(t: int = 4096, d: int = 64) -> None:
    """One bf16 forward and backward at B·T 32,768, 8 heads, causal, on random inputs (the launches
    an ncu profile takes; ones would make every softmax row flat)."""
    import cupy
    import numpy as np

    from smallem.autodiff.attention import Attention
    from smallem.backends import get_backend
    from smallem.backends.cuda import attention

    be = get_backend("gpu", "bf16")
    cupy.random.seed(t)
    q, k, v, g = (cupy.random.standard_normal((32_768 // t, t, 8, d), dtype=np.float32).transpose(0, 2, 1, 3)
                  for _ in range(4))
    op = Attention(causal=True)
    out = attention.attention_forward(be, q, k, v, op)
    attention.attention_rule(be, g, out, q, k, v, op)
    be.synchronize()


def main() -> None:
    import attention_round10_variants as rv  # benchmarks/

    rv.VARIANTS = VARIANTS  # its use(), applies(), shape_rows() read the module's VARIANTS
    rv.DEFAULT = DEFAULT
    rv.SHAPES = [(t, 64) for t in (1024, 2048, 4096)]
    rv.main()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--build"]:
        build(sys.argv[2])
    else:
        main()

"""Kernels compiled here by nvcc before a device call, loaded there instead of NVRTC's compile
(round 9, issue 37: NVRTC took a minute of each call's device time on a fresh machine).
`python benchmarks/cubins.py DIR [variants] [variants9]` writes DIR/<sha1 of the source>.cubin
for the tensor-core attention's sources (defaults, the tests' staged, tiled and wgmma settings,
attention_round10_variants' and r13_bwd_variants' variants; round 9's with variants9) and
every other source of the room (all_sources()); on the device `cubins.install(DIR)` makes
`common.compiled` load a source's cubin when DIR has one and compile it as before otherwise: the
same source text, nvcc 13.0 -arch=sm_90a.
"""

import copy
import hashlib
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from smallem.backends.cuda import attention_mma, common


def name(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest() + ".cubin"


def install(folder: str) -> None:
    """common.compiled loads DIR's cubin of a source where there is one."""
    import cupy

    cache: dict = {}

    def original(source: str):  # NVRTC, for sm_90a as the cubins are: SM90A below says the modules
        # are, so a source without a cubin (a test's configuration not built here) must be too, or
        # its wgmma forward is the plain-sm_90 trap (round 10's last call: 192 tests down with it)
        return cupy.RawModule(code=source, options=("-arch=sm_90a",))

    def compiled(source: str, arch: str = ""):  # every module is sm_90a's here
        if source not in cache:
            path = Path(folder) / name(source)
            try:
                cache[source] = cupy.RawModule(path=str(path)) if path.exists() else original(source)
            except Exception as error:  # a cubin the driver refuses: NVRTC's compile, as before
                print(f"cubins: {path.name} not loaded ({error}): compiled by NVRTC", flush=True)
                cache[source] = original(source)
        return cache[source]

    compiled.nvrtc = common.compiled  # the cached original, which tests that need it put back
    common.compiled = compiled
    attention_mma.SM90A = True  # the cubins are nvcc's sm_90a: the wgmma forward may run


def configs(variants: bool, variants9: bool = False) -> list:
    """(config, formats, widths, copies) of every module worth compiling ahead."""
    base = attention_mma.CONFIG
    out = []
    for staged in (None, 0, 1):  # the defaults, and the tests' staged settings
        cfg = copy.deepcopy(base)
        if staged is not None:
            cfg["staged"] = {w: (staged, staged) for w in attention_mma.WIDTHS}
        out += [(cfg, (f,), (d,), copies) for f in attention_mma.FORMATS for d in attention_mma.WIDTHS
                for copies in (False, True)]
    for warps, kr in ((4, 1), (4, 0), (8, 1)):  # round 9b: the tiled keyq's tests (test_attention_fused_gpu)
        cfg = copy.deepcopy(base)
        cfg["staged"] = {w: (0, 0) for w in attention_mma.WIDTHS}
        cfg["tiled"][64], cfg["key"][64], cfg["key_wg"][64] = 1, (warps, 64, kr, 0), 0
        out += [(cfg, (f,), (64,), copies) for f in attention_mma.FORMATS for copies in (False, True)]
    for staged in (0, 1):  # test_halves' configs: today's keyq (tiled off) and the tiled one
        for tiled in (0, 1):
            cfg = copy.deepcopy(base)
            cfg["staged"] = {w: (staged, staged) for w in attention_mma.WIDTHS}
            cfg["tiled"][64], cfg["key_wg"][64] = tiled, 0
            out += [(cfg, (f,), (d,), copies) for f in attention_mma.FORMATS for d in attention_mma.WIDTHS
                    for copies in (False, True)]
    # round 11: keyq by wgmma as its tests set it (test_attention_fused_gpu: registers capped or
    # not; test_halves: every width staged 0, with copies) and as the defaults would be with it on;
    # round 13: with the LF twin (any key_lf but 0: the same source) or not
    for way in (1,):
        for blocks, staged in ((0, 0), (3, 0), (0, None), (3, None)):
            for lf in (0, 1):
                cfg = copy.deepcopy(base)
                cfg["key_wg"][64], cfg["key"][64], cfg["key_lf"][64] = way, (4, 64, 1, blocks), lf
                if staged is not None:
                    cfg["staged"] = {w: (staged, staged) for w in attention_mma.WIDTHS}
                out += [(cfg, (f,), (64,), copies) for f in attention_mma.FORMATS for copies in (False, True)]
    # round 10: the forward's switches as test_the_forward_s_round_10_switches_match_float64 sets
    # them (every width, without copies, as those passes run), and attention_round10.py's variants
    # (bf16 and fp16: its float64 checks)
    for opts in ((0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (1, 1, 1), (0, 0, 1)):
        cfg = copy.deepcopy(base)
        cfg["forward_opts"] = {w: opts for w in attention_mma.WIDTHS}
        out += [(cfg, (f,), (d,), False) for f in attention_mma.FORMATS for d in attention_mma.WIDTHS]
    import attention_round10 as r10  # benchmarks/

    for name, change in r10.VARIANTS.items():
        out += [(r10.configured(change), (f,), (d,), copies) for f in attention_mma.FORMATS for d in (64, 128)
                for copies in (False, True)]  # with copies: the tests under a variant as the defaults
        if name in r10.CANDIDATES:  # those tests' staged settings (test_halves, the versions' test)
            for staged in (0, 1):
                cfg = r10.configured(change)
                cfg["staged"] = {w: (staged, staged) for w in attention_mma.WIDTHS}
                out += [(cfg, (f,), (d,), copies) for f in attention_mma.FORMATS for d in (64, 128)
                        for copies in (False, True)]
    if variants:
        import attention_round10_variants as v10  # benchmarks/
        import r13_bwd_variants as v13  # benchmarks/

        out += [(v10.configured(change), ("bf16",), (d,), False) for change in v10.VARIANTS.values()
                for d in (64, 128) if v10.applies(change, d)]
        out += [(v13.configured(change), ("bf16",), (64,), copies) for change in v13.VARIANTS.values()
                for copies in (False, True)]
    if variants9:
        import attention_round9_variants as v  # benchmarks/

        for change in v.VARIANTS.values():
            out += [(v.configured(change), ("bf16",), (d,), copies) for d in v.widths(change)
                    for copies in (False, True)]
    return out


def compile_all(folder: str, sources: set[str]) -> None:
    """Each source to FOLDER/name(source) by nvcc for sm_90a (kept where already there), two at a
    time; one line of how many were built, kept, failed."""
    Path(folder).mkdir(parents=True, exist_ok=True)

    def one(source: str) -> str:
        target = Path(folder) / name(source)
        if target.exists():
            return "kept"
        with tempfile.TemporaryDirectory() as tmp:
            cu = Path(tmp) / "k.cu"
            cu.write_text(source)
            run = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-o", str(target), str(cu)],
                                 capture_output=True, text=True)
        return "built" if run.returncode == 0 else f"FAILED {run.stderr[:2000]}"

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, sorted(sources)))
    print(f"{len(sources)} sources: " + ", ".join(f"{r} {results.count(r)}" for r in sorted(set(results))))


def build(folder: str, variants: bool, variants9: bool = False) -> None:
    from smallem.backends.cuda import all_sources

    Path(folder).mkdir(parents=True, exist_ok=True)
    sources = {attention_mma.source(c, f, w, copies) for c, f, w, copies in configs(variants, variants9)}
    sources |= set(all_sources().values())  # every other module a step compiles
    import attention_round10 as r10  # benchmarks/

    sources.add(r10.wg_check_source())  # round 10: the wgmma products checked alone

    compile_all(folder, sources)

if __name__ == "__main__":
    build(sys.argv[1], "variants" in sys.argv[2:], "variants9" in sys.argv[2:])

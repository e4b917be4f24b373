"""Round 10 (issue 37): the bf16 attention's forward variants (CONFIG["forward_opts"]: LF the
longest causal blocks of every head first, LZ O rescaled only where a row's max moved, WG the
products by wgmma; attention_mma_forward*.py) beside today's CONFIG. Each variant first checked
against float64 (bf16 and fp16, causal and not, max of O, dQ, dK, dV relative errors; the tests'
bound is 8·eps), then timed captured (CUDA graph replays, device events, median of 20): the
forward alone (converts + kernel) and forward + backward as `smallem bench --attention` runs it;
B·T = 32,768, 8 heads, causal. Stages (argv[1]): `variants` [json]; `bench` [json] (bench's rows
per variant in one process, PyTorch's beside them; BENCH=auto picks them from VARIANTS_JSON);
`once` VARIANTS (two forwards each on random inputs, for ncu); `probe` (does CuPy's NVRTC
compile wgmma for sm_90a?).
`CUBINS=DIR python benchmarks/attention_round10.py STAGE ...` (DIR: benchmarks/cubins.py's).
"""

import copy
import json
import os
import sys

import numpy as np

from smallem.autodiff.attention import Attention
from smallem.backends import get_backend
from smallem.backends.cuda import attention, attention_mma
from smallem.backends.precision import tolerance

TOKENS, HEADS = 32_768, 8
LENGTHS = tuple(int(x) for x in os.environ.get("LENGTHS", "1024 2048 4096").split())
DEFAULT = copy.deepcopy(attention_mma.CONFIG)
# name -> {kind: {width: CONFIG's tuple}}: changes from CONFIG
VARIANTS = {
    "defaults": {},
    "LF": {"forward_opts": {64: (1, 0, 0), 128: (1, 0, 0)}},
    "LF+LZ": {"forward_opts": {64: (1, 1, 0), 128: (1, 1, 0)}},
    "WG8+LF+LZ": {"forward": {64: (8, 64, 1, 1)}, "forward_opts": {64: (1, 1, 1)}},
    "WG8P+LF+LZ": {"forward": {64: (8, 64, 1, 1)}, "forward_opts": {64: (1, 1, 2)}},
    "WG4+LF+LZ": {"forward": {64: (4, 64, 1, 1)}, "forward_opts": {64: (1, 1, 1)}},
    "WG4P+LF+LZ": {"forward": {64: (4, 64, 1, 1)}, "forward_opts": {64: (1, 1, 2)}},
}

# what BENCH=auto (and the tests under a variant as the defaults) may pick
CANDIDATES = ("LF+LZ", "WG8+LF+LZ", "WG8P+LF+LZ", "WG4+LF+LZ", "WG4P+LF+LZ")


def configured(change: dict) -> dict:
    cfg = copy.deepcopy(DEFAULT)
    for kind, widths in change.items():
        cfg[kind].update(widths)
    return cfg


def use(name: str) -> None:
    """CONFIG as the variant `name` sets it (in place: the launchers read the module's dict)."""
    for kind, widths in configured(VARIANTS[name]).items():
        attention_mma.CONFIG[kind].update(widths)


def errors(precision: str, d: int, t: int, s: int, causal: bool) -> list[float]:
    """‖got − float64‖ / ‖float64‖ of O, dQ, dK, dV (B 2, H 2), fresh random inputs."""
    import attention_mma_variants as base  # benchmarks/: the float64 reference
    import cupy

    be = get_backend("gpu", precision)
    rng = np.random.default_rng(t * 7 + d + causal)
    xs = [rng.normal(size=(2, 2, n, d)) for n in (t, s, s, t)]
    q, k, v, g = (cupy.asarray(x, dtype=np.float32) for x in xs)
    op = Attention(causal=causal)
    out = attention.attention_forward(be, q, k, v, op)
    grads = attention.attention_rule(be, g, out, q, k, v, op)
    got = [cupy.asnumpy(x) for x in (out, *grads)]
    ref = base.reference(*xs, causal)
    return [float(np.linalg.norm(a - r) / np.linalg.norm(r)) for a, r in zip(got, ref)]


def timings(t: int, d: int) -> tuple[float, float]:
    """(forward ms, forward + backward ms), each captured and replayed (bench_attention's timer)."""
    from smallem.tools import bench_attention as b

    be = get_backend("gpu", "bf16")
    q, k, v, g = b._inputs(be, TOKENS // t, t, d, seed=t + d)
    op = Attention(causal=True)
    fwd, _ = b._device_timer(be, lambda: attention.attention_forward(be, q, k, v, op))
    both, _ = b._device_timer(be, b.smallem_pass(be, True, q, k, v, g))
    return fwd, both


def variants(path: str | None) -> None:
    names = os.environ.get("ONLY", ";".join(VARIANTS)).split(";")
    widths = tuple(int(x) for x in os.environ.get("WIDTHS", "64").split())
    rows = []
    if path and os.path.exists(path):  # an earlier process's variants (one process a wgmma variant)
        with open(path) as f:
            rows = json.load(f)
    for name in names:
        use(name)
        err = {}
        for d in widths:
            for precision in ("bf16", "fp16"):
                e = errors(precision, d, 300, 300, True) + errors(precision, d, 70, 130, False)
                err[f"{precision} {d}"] = max(e)
        bad = any(not np.isfinite(e) or e > tolerance(k.split()[0]) for k, e in err.items())
        print(f"{name:12s} errors " + ", ".join(f"{k} {e:.2e}" for k, e in err.items()) +
              ("  WRONG: not timed" if bad else ""), flush=True)
        for d in widths:
            for t in LENGTHS if not bad else ():
                fwd, both = timings(t, d)
                flop = 4 * (TOKENS // t) * HEADS * t * t * d / 2
                rows.append({"variant": name, "T": t, "D": d, "forward_ms": fwd, "ms": both,
                             "forward_tflops": flop / fwd / 1e9, "tflops": 3.5 * flop / both / 1e9,
                             "errors": err})
                print(f"{name:12s} D {d:3d} T {t:5d} forward {fwd:7.3f} ms ({flop / fwd / 1e9:5.1f} TFLOP/s)"
                      f"  fwd+bwd {both:7.3f} ms ({3.5 * flop / both / 1e9:5.1f} TFLOP/s)", flush=True)
        use("defaults")
        if path:
            with open(path, "w") as f:
                json.dump(rows, f, indent=1)


def chosen(path: str) -> list[str]:
    """BENCH=auto: the defaults, LF+LZ, and the candidate of the variants' JSON (this call's) with
    the least forward + backward summed over the lengths, among those timed (correct) at every
    length."""
    with open(path) as f:
        rows = json.load(f)
    totals: dict = {}
    for r in rows:
        if r["D"] == 64:
            totals.setdefault(r["variant"], []).append(r["ms"])
    whole = {n: sum(ms) for n, ms in totals.items() if len(ms) == len(LENGTHS) and n in CANDIDATES}
    best = min(whole, key=whole.get) if whole else "LF+LZ"
    return list(dict.fromkeys(["defaults", "LF+LZ", best]))


def bench(path: str | None) -> None:
    """`smallem bench --attention`'s D 64 bf16 rows for each variant of BENCH (";"-separated, or
    auto: chosen()), one process."""
    from smallem.tools import bench_attention as b
    from smallem.tools.bench import machine

    b.REPS = 20
    out = {"device": "gpu", "machine": machine()}
    widths = tuple(int(x) for x in os.environ.get("WIDTHS", "64").split())
    names = os.environ.get("BENCH", "auto")
    names = chosen(os.environ["VARIANTS_JSON"]) if names == "auto" else names.split(";")
    for i, name in enumerate(names):  # PyTorch's rows beside the first and the last
        use(name)
        print(f"=== {name}", flush=True)
        torch = i in (0, len(names) - 1)
        out[name] = b.attention_rows("gpu", torch, print, widths, LENGTHS, ("bf16",))
        use("defaults")
        if path:
            with open(path, "w") as f:
                json.dump(out, f, indent=1)


def once(names: str) -> None:
    """Two forwards at D 64, T 4,096 on random inputs (ncu's launches) per variant of `names`
    (";"-separated), in that order."""
    from smallem.tools import bench_attention as b

    be = get_backend("gpu", "bf16")
    q, k, v, _ = b._inputs(be, TOKENS // 4096, 4096, 64, seed=1)
    op = Attention(causal=True)
    names = ";".join(chosen(os.environ["VARIANTS_JSON"])) if names == "auto" else names
    for name in names.split(";"):
        use(name)
        print(f"once: {name}", flush=True)
        for _ in range(2):
            attention.attention_forward(be, q, k, v, op)
        be.synchronize()


def probe() -> None:
    """Whether CuPy's NVRTC compile takes sm_90a (the wgmma forward's target) by an option: a
    small module with the wgmma helpers, one kernel writing WG_OK (1 where they compiled)."""
    import cupy

    from smallem.backends.cuda.attention_mma_forward import KERNELS
    from smallem.backends.cuda.attention_mma_forward_wg import KERNELS_WG
    from smallem.backends.cuda.attention_mma_tiles import TILES
    from smallem.backends.cuda.common import HEADER

    src = (HEADER + "#define COPIES 0\n" + TILES + KERNELS + KERNELS_WG +
           'extern "C" __global__ void wg_probe(int* out) { *out = WG_OK; }\n')
    def low_level():  # NVRTC's own calls (CuPy's bindings): sm_90a cubin, loaded as a module
        from cupy.cuda import function, nvrtc

        prog = nvrtc.createProgram(src, "wg_probe.cu", (), ())
        nvrtc.compileProgram(prog, ("-arch=sm_90a", "-ftz=true"))
        module = function.Module()
        module.load(nvrtc.getCUBIN(prog))
        return module.get_function("wg_probe")

    tries = [(str(o), lambda o=o: cupy.RawModule(code=src, options=o).get_function("wg_probe"))
             for o in ((), ("-arch=sm_90a",), ("--gpu-architecture=sm_90a",))]
    for name, make in tries + [("nvrtc.compileProgram -arch=sm_90a, getCUBIN", low_level)]:
        try:
            fn = make()
            out = cupy.zeros(1, dtype=cupy.int32)
            fn((1,), (1,), (out,))
            print(f"probe: {name}: compiled, WG_OK = {int(out[0])}", flush=True)
        except Exception as error:  # noqa: BLE001 - the probe's answer
            print(f"probe: {name}: {type(error).__name__}: {str(error)[:300]}", flush=True)


def main() -> None:
    if os.environ.get("CUBINS"):
        import cubins  # benchmarks/

        cubins.install(os.environ["CUBINS"])
    stage, rest = sys.argv[1], sys.argv[2:]
    if stage == "variants":
        variants(rest[0] if rest else None)
    elif stage == "bench":
        bench(rest[0] if rest else None)
    elif stage == "once":
        once(rest[0])
    elif stage == "probe":
        probe()


if __name__ == "__main__":
    main()

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
VARIANTS = {  # round 10's call 1 also ran WG8+LF+LZ, WG4+LF+LZ: a first wgmma form, wrong, removed
    "defaults": {},
    "round 9": {"forward_opts": {64: (0, 0, 0)}},
    "LF": {"forward_opts": {64: (1, 0, 0), 128: (1, 0, 0)}},
    "LF+LZ": {"forward_opts": {64: (1, 1, 0), 128: (1, 1, 0)}},
    "WG8P+LF+LZ": {"forward": {64: (8, 64, 1, 1)}, "forward_opts": {64: (1, 1, 1)}},
    "WG4P+LF+LZ": {"forward": {64: (4, 64, 1, 1)}, "forward_opts": {64: (1, 1, 1)}},
}
# what BENCH=auto (and the tests under a variant as the defaults) may pick
CANDIDATES = ("LF+LZ", "WG8P+LF+LZ", "WG4P+LF+LZ")


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
    """Each variant of ONLY checked, then timed (rows appended to `path`'s); TORCH=1: PyTorch's
    bf16 SDPA (cuDNN, its default) forward + backward first, bench_attention's captured row."""
    names = os.environ.get("ONLY", ";".join(VARIANTS)).split(";")
    widths = tuple(int(x) for x in os.environ.get("WIDTHS", "64").split())
    rows = []
    if path and os.path.exists(path):  # an earlier process's variants (one process a wgmma variant)
        with open(path) as f:
            rows = json.load(f)
    if os.environ.get("TORCH") == "1":
        from smallem.tools import bench_attention as b

        for d in widths:
            for t in LENGTHS:
                r = b._torch_row("gpu", TOKENS // t, t, d, "bf16", "cudnn")
                if r:
                    rows.append({"variant": "torch cudnn", "T": t, "D": d, "ms": r["ms"]})
                    print(f"torch cudnn  D {d:3d} T {t:5d} fwd+bwd {r['ms']:7.3f} ms", flush=True)
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


WG_CHECK = r"""
// One warpgroup: S = Q Kᵀ and O = P V of 64 x 64 bf16 tiles (row-major in q, k, v, p) by the
// wgmma forward's own helpers (swizzled K, V tiles, descriptors; Q, P as A registers), S and O
// written out (64 x 64 float32 each): where the forward is wrong, which product is.
extern "C" __global__ void wg_check(const half_t* q, const half_t* k, const half_t* v, const half_t* p,
                                    float* s_out, float* o_out) {
    extern __shared__ __align__(16) half_t smem[];
    half_t* kv = smem + (((1024u - (sm(smem) & 1023u)) & 1023u) >> 1);
    half_t *qs = kv + 2 * 64 * 64, *ps = qs + 64 * 72;
    tile_sw128<128>(kv, k, 64);
    tile_sw128<128>(kv + 64 * 64, v, 64);
    cp_commit();
    for (int i = threadIdx.x; i < 64 * 8; i += 128) {
        int r = i >> 3, c = (i & 7) * 8;
        *(uint4*)(qs + r * 72 + c) = *(const uint4*)(q + r * 64 + c);
        *(uint4*)(ps + r * 72 + c) = *(const uint4*)(p + r * 64 + c);
    }
    cp_wait_all();
    async_proxy_fence();
    __syncthreads();
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    unsigned qf[4][4], pf[4][4];
    for (int kc = 0; kc < 4; ++kc) {
        frag_a(qf[kc], qs, 72, warp * 16, kc * 16);
        frag_a(pf[kc], ps, 72, warp * 16, kc * 16);
    }
    float s[8][4], acc[8][4];
    for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    wg_hold<8>(s);
    wg_fence();
    wg_scores<0>(s, qf, sw128(kv));
    wg_commit();
    wg_wait<0>();
    wg_hold<8>(s);
    wg_hold<8>(acc);
    wg_fence();
    wg_pv<0>(acc, pf, sw128(kv + 64 * 64));
    wg_commit();
    wg_wait<0>();
    wg_hold<8>(acc);
    for (int i = 0; i < 8; ++i)
        for (int e = 0; e < 4; ++e) {
            int row = warp * 16 + g + 8 * (e >> 1), col = i * 8 + 2 * t + (e & 1);
            s_out[row * 64 + col] = s[i][e];
            o_out[row * 64 + col] = acc[i][e];
        }
}
"""


def wg_check_source() -> str:
    """The module of wg_check: the attention modules' text before it (built as a cubin here)."""
    from smallem.backends.cuda.attention_mma_forward import KERNELS
    from smallem.backends.cuda.attention_mma_forward_wg import KERNELS_WG
    from smallem.backends.cuda.attention_mma_tiles import TILES
    from smallem.backends.cuda.common import HEADER

    return HEADER + "#define COPIES 0\n" + TILES + KERNELS + KERNELS_WG + WG_CHECK


def wg_check() -> None:
    """The products of wg_check against float64 on bf16-exact random tiles (relative errors)."""
    import cupy

    from smallem.backends.cuda import common

    rng = np.random.default_rng(5)
    tiles = [rng.normal(size=(64, 64)).astype(np.float32) for _ in range(4)]
    bits = [(x.view(np.uint32) >> 16).astype(np.uint16) for x in tiles]  # bf16 by truncation
    exact = [(b.astype(np.uint32) << 16).view(np.float32).astype(np.float64) for b in bits]
    q, k, v, p = exact
    fn = common.compiled(wg_check_source()).get_function("wg_check")
    fn.max_dynamic_shared_size_bytes = 1024 + 4 * 64 * 64 * 2 + 2 * 64 * 72 * 2
    s_out, o_out = cupy.zeros((64, 64), np.float32), cupy.zeros((64, 64), np.float32)
    fn((1,), (128,), (*[cupy.asarray(b) for b in bits], s_out, o_out),
       shared_mem=1024 + 4 * 64 * 64 * 2 + 2 * 64 * 72 * 2)
    for name, got, ref in (("S = Q Kt", s_out, q @ k.T), ("O = P V", o_out, p @ v)):
        got = cupy.asnumpy(got).astype(np.float64)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        print(f"wg_check {name}: relative error {err:.2e}; row 0 got {np.round(got[0, :6], 3)} "
              f"want {np.round(ref[0, :6], 3)}; row 9 got {np.round(got[9, :4], 3)} want "
              f"{np.round(ref[9, :4], 3)}", flush=True)
        if err > 1e-4:  # which layout it matches: transposed B, or B's rows in another order
            for alt, r in (("Q K (K untransposed)", q @ k), ("P Vt", p @ v.T)):
                print(f"wg_check   {name} against {alt}: {np.linalg.norm(got - r) / np.linalg.norm(r):.2e}")


def main() -> None:
    if os.environ.get("CUBINS"):
        import cubins  # benchmarks/

        cubins.install(os.environ["CUBINS"])
    if os.environ.get("SM90A") == "nvrtc":  # the modules by CuPy's NVRTC with -arch=sm_90a, no cubins
        attention_mma.SM90A = "nvrtc"
    stage, rest = sys.argv[1], sys.argv[2:]
    if stage == "variants":
        variants(rest[0] if rest else None)
    elif stage == "bench":
        bench(rest[0] if rest else None)
    elif stage == "once":
        once(rest[0])
    elif stage == "probe":
        probe()
        wg_check()


if __name__ == "__main__":
    main()

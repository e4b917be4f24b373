"""Rounds 13 and 14, issue 37: the float32 attention's 3xTF32 kernels (backends/cuda/attention_f32_tc.py
forward, attention_f32_tc_grad.py backward) on the device, and their modules built here first.
  python benchmarks/r13_f32tc.py cubins DIR   (here: nvcc, every module the call loads)
  python benchmarks/r13_f32tc.py variants OUT.json [CUBINS]   (device)
  python benchmarks/r13_f32tc.py bench OUT.json [CUBINS]   (device: variants, then the rows)
  python benchmarks/r13_f32tc.py tests|broken CUBINS|-- -- PYTEST_ARGS   (device: pytest; broken:
  with the small terms cut)
  python benchmarks/r13_f32tc.py profile - [CUBINS]   (device, under ncu: one D 128 pass at T 4,096)
variants: each of VARIANTS' forward tiles and BACKWARD's backward tiles checked against float64
(small shapes) and timed at the bench's shapes (causal, H 8, B·T 32,768, T 512 … 4,096; median
of 20 by device events) beside attention_f32.py's FFMA passes and PyTorch's float32 SDPA (forward,
and forward + backward); per width the forward with the least summed time (of those within 1e-5
of float64 and faster than the FFMA pass summed over T), and the backward that takes the least
time summed over T with the FFMA pass below the T from which it wins at every T (FROM), are
printed as the tiles to adopt, and set in this process (and written to OUT.json after each
width). bench: variants in a process of its own, its
choices adopted (adopt), then `smallem bench --attention`'s float32 rows at ROWS beside
PyTorch's (bench_attention.attention_rows, captured), into OUT.json's "bench". broken: the 3xTF32
products without their two small terms (one TF32 product): the tests given must fail.
Round 13's first calls: results/round13/f32/ (forward variants), call3/ (the forward's split pass);
round 14's: results/round14/f32/ (the backward's DS 2, per-T FROM).
"""

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import cubins  # noqa: E402

from smallem.backends.cuda import all_sources, attention_f32_tc, attention_f32_tc_grad  # noqa: E402

VARIANTS = {64: [(8, 32, 0, 1)], 128: [(8, 32, 0, 0)]}  # the forward: call 3 chose these
# the backward (W, BM): round 14's call 1 chose two warps a 16 keys at both widths over round 13's
# one, PF 1 and 16 warps (results/round14/f32/call1/; the records' (W, BM, PF, DS)); call 2 (the
# split by integer ops, dS split once) kept it at D 64 over (4, 32, 1, 1) (call2/)
BACKWARD = {64: [(8, 32)], 128: [(8, 16)]}
WIDTHS = tuple(int(d) for d in os.environ.get("WIDTHS", "64 128").split())  # the variants'
ROWS = tuple(int(d) for d in os.environ.get("ROWS", "32 64 128").split())  # the bench rows' widths
LENGTHS = (512, 1024, 2048, 4096)
HEADS, TOKENS, REPS = 8, 32_768, 20
CHECKS = ((1, 2, 333, 333, True), (2, 3, 70, 90, False), (1, 1, 1, 1, True))
# Measured, never adopted here (round 14): the kinds "fwdraw", "bwdraw" time the first tiles with
# the small part left unrounded (the tensor cores read its top 19 bits): two instructions a split
# fewer than rna's add and mask.
KERNELS = attention_f32_tc.KERNELS
RAW = (("small = rna(x - __uint_as_float(big));", "small = __float_as_uint(x - __uint_as_float(big));"),
       ("small[e] = rna(x[e] - __uint_as_float(big[e]));",
        "small[e] = __float_as_uint(x[e] - __uint_as_float(big[e]));"))


def _reset() -> None:
    """SOURCE of both modules again from TC, TCB (and KERNELS) as they are now."""
    for module in (attention_f32_tc, attention_f32_tc_grad):
        module._source.cache_clear()
        module.SOURCE = module.source()


def _raw(on: bool) -> None:
    """The device split with the small part unrounded (RAW) or as the room has it."""
    text = KERNELS
    for a, b in RAW if on else ():
        assert a in text
        text = text.replace(a, b)
    attention_f32_tc.KERNELS = text
    for module in (attention_f32_tc, attention_f32_tc_grad):
        module._source.cache_clear()


def _set(kind: str, d: int, tiles: tuple) -> None:
    """One width's tiles, and SOURCE of that width alone (a module built here for each); kinds
    fwdraw, bwdraw with RAW's split."""
    _raw(kind.endswith("raw"))
    module, table = ((attention_f32_tc, attention_f32_tc.TC) if kind.startswith("fwd")
                     else (attention_f32_tc_grad, attention_f32_tc_grad.TCB))
    table[d] = tiles
    module.SOURCE = module.source({d: tiles})


def broken() -> None:
    """The split products as one TF32 product each (forward and backward): the tests must fail."""
    attention_f32_tc.KERNELS = attention_f32_tc.KERNELS.replace(
        "mma_tf32(c, as, bb[0], bb[1]);\n    mma_tf32(c, ab, bs[0], bs[1]);\n", "")
    _reset()


def sources() -> set[str]:
    """Every module a call loads: the room's, each tiling of one width, each pair of widths the
    variants may adopt (forward, backward), the defaults with the small terms cut."""
    fwd, bwd = attention_f32_tc.source, attention_f32_tc_grad.source
    out = set(all_sources().values())
    out |= {fwd({d: x}) for d, tries in VARIANTS.items() for x in tries}
    out |= {bwd({d: x}) for d, tries in BACKWARD.items() for x in tries}
    out |= {fwd({64: a, 128: b}) for a in VARIANTS[64] for b in VARIANTS[128]}
    out |= {bwd({64: a, 128: b}) for a in BACKWARD[64] for b in BACKWARD[128]}
    _raw(True)
    out |= {fwd({d: x[0]}) for d, x in VARIANTS.items()} | {bwd({d: x[0]}) for d, x in BACKWARD.items()}
    _raw(False)
    kernels = attention_f32_tc.KERNELS
    broken()
    out |= {attention_f32_tc.SOURCE, attention_f32_tc_grad.SOURCE}
    attention_f32_tc.KERNELS = kernels
    _reset()
    return out


def _time(run) -> float:
    import cupy

    for _ in range(3):
        run()
    times = []
    for _ in range(REPS):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def _errors(d: int) -> float:
    """The worst ‖error‖ / max(‖float64‖, size) of O, dQ, dK, dV over CHECKS with TC's, TCB's
    tiles at every T (the FFMA backward where TCB has none for d): the float64 reference and sizes
    of tests/test_attention_f32_tc_gpu.py."""
    import cupy
    import numpy as np
    from test_attention_f32_tc_gpu import reference, scales

    from smallem.backends.cuda import attention_f32

    worst = 0.0
    for b, h, t, s, causal in CHECKS:
        rng = np.random.default_rng(t)
        xs = [rng.normal(size=(b, h, n, d)) for n in (t, s, s, t)]
        q, k, v, g = (cupy.asarray(x, dtype=np.float32) for x in xs)
        out, lse = cupy.empty_like(q), cupy.empty((b, h, t, 1), np.float32)
        attention_f32_tc.forward(q, k, v, out, lse, (b, h), 1 / np.sqrt(d), causal)
        grads = (cupy.empty_like(q), cupy.empty_like(k), cupy.empty_like(v))
        backward = attention_f32_tc_grad.backward if d in attention_f32_tc_grad.TCB else \
            attention_f32.backward
        backward(q, k, v, g, out, lse, grads, (b, h), 1 / np.sqrt(d), causal)
        refs, sizes = reference(*xs, causal), scales(*xs, causal)
        for a, r, size in zip((out, *grads), refs, sizes):
            a = cupy.asnumpy(a)
            e = np.linalg.norm(a - r) / max(np.linalg.norm(r), size)
            worst = max(worst, float(e) if np.isfinite(a).all() else float("inf"))
    return worst


def variants(path: str) -> dict:
    import cupy
    import numpy as np

    from smallem.backends.cuda import attention_f32

    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        torch = None
    rows, best, checked = [], {}, {}
    for d in WIDTHS:
        tries = [("fwd", x) for x in VARIANTS[d]] + [("bwd", x) for x in BACKWARD[d]] + \
            [("fwdraw", VARIANTS[d][0]), ("bwdraw", BACKWARD[d][0])]
        ok = {}
        _set("bwd", d, BACKWARD[d][0])  # this width's backward module (call 2: the last width's faulted)
        for kind, tiles in tries:
            _set(kind, d, tiles)
            ok[(kind, tiles)] = checked[f"{d} {kind} {tiles}"] = err = _errors(d)
            print(f"D {d} {kind} {tiles}: O, dQ, dK, dV against float64 {err:.2e}", flush=True)
        _set("fwd", d, VARIANTS[d][0])
        _set("bwd", d, BACKWARD[d][0])
        times: dict = {}
        for t in LENGTHS:
            b = TOKENS // t
            rng = np.random.default_rng(t + d)
            q, k, v, g = (cupy.asarray(rng.normal(size=(b, HEADS, t, d)), dtype=np.float32)
                          for _ in range(4))
            out, lse = cupy.empty_like(q), cupy.empty((b, HEADS, t, 1), np.float32)
            grads = (cupy.empty_like(q), cupy.empty_like(k), cupy.empty_like(v))
            fwd = (q, k, v, out, lse, (b, HEADS), 1 / np.sqrt(d), True)
            bwd = (q, k, v, g, out, lse, grads, (b, HEADS), 1 / np.sqrt(d), True)
            row = {"D": d, "T": t, "ffma_fwd": _time(lambda: attention_f32.forward(*fwd))}
            attention_f32_tc.forward(*fwd)
            row["ffma_bwd"] = _time(lambda: attention_f32.backward(*bwd))
            for kind, tiles in tries:
                _set(kind, d, tiles)
                if kind.startswith("fwd"):
                    row[f"{kind} {tiles}"] = _time(lambda: attention_f32_tc.forward(*fwd))
                else:
                    row[f"{kind} {tiles}"] = _time(lambda: attention_f32_tc_grad.backward(*bwd))
                times.setdefault((kind, tiles), []).append(row[f"{kind} {tiles}"])
            if torch is not None:
                tq, tk, tv, tg = (torch.as_tensor(x, device="cuda") for x in (q, k, v, g))
                row["torch_fwd"] = _time(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True))
                tq, tk, tv = (x.requires_grad_() for x in (tq, tk, tv))

                def both():
                    o = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
                    return torch.autograd.grad(o, (tq, tk, tv), tg)

                row["torch_fwd_bwd"] = _time(both)
                del tq, tk, tv, tg
            rows.append(row)
            print(json.dumps({x: round(y, 4) if isinstance(y, float) else y for x, y in row.items()}),
                  flush=True)
        for kind, table in (("fwd", attention_f32_tc.TC), ("bwd", attention_f32_tc_grad.TCB)):
            good = [x for k, x in tries if k == kind and ok[(k, x)] < 1e-5]
            ffma = [r[f"ffma_{kind}"] for r in rows if r["D"] == d]
            if kind == "fwd":
                faster = [x for x in good if sum(times[(kind, x)]) < sum(ffma)]  # else FFMA stays
                table[d] = min(faster, key=lambda x: sum(times[(kind, x)])) if faster else None
            else:
                table[d], best[f"{d} from"] = choose(good, [times[(kind, x)] for x in good], ffma)
                attention_f32_tc_grad.FROM[d] = best[f"{d} from"]
            best[f"{d} {kind}"] = table[d]
            print(f"D {d} {kind}: adopt {table[d]}" + (f" from T {best[f'{d} from']}"
                                                        if kind == "bwd" else ""), flush=True)
            if table[d] is None:
                del table[d]  # none within float32's bound: the FFMA pass
        Path(path).write_text(json.dumps({"rows": rows, "best": best, "errors": checked}, indent=1))
    _raw(False)
    _reset()  # both widths' adopted tiles in one module each, as a user's run builds them
    return best


def choose(tilings: list, times: list, ffma: list) -> tuple:
    """(tiles, FROM) of the backward: per tiling, the least T of LENGTHS from which it beats the
    FFMA pass at every T (0 where at every T), the FFMA pass below it; the least time summed over
    T. (None, 0) where no tiling beats FFMA at the longest T."""
    found = []
    for tiles, mine in zip(tilings, times):
        wins = [i for i in range(len(mine)) if all(a < b for a, b in zip(mine[i:], ffma[i:]))]
        if wins:
            first = wins[0]
            found.append((sum(ffma[:first]) + sum(mine[first:]), tiles, LENGTHS[first] if first else 0))
    return min(found)[1:] if found else (None, 0)


def adopt(best: dict) -> None:
    """variants' choices ({"64 fwd": tiles or None, "64 from": T, ...}) into TC, TCB, FROM and
    SOURCE; a width not there keeps the defaults (TC's forward, the FFMA backward)."""
    for key, tiles in best.items():
        d, kind = int(key.split()[0]), key.split()[1]
        if kind == "from":
            attention_f32_tc_grad.FROM[d] = tiles
            continue
        table = attention_f32_tc.TC if kind == "fwd" else attention_f32_tc_grad.TCB
        if tiles is None:
            table.pop(d, None)
        else:
            table[d] = tuple(tiles)
    _reset()


def bench(path: str) -> None:
    """variants in a process of its own (a kernel that faults there costs its choices, not the
    rows), then the rows with what it chose."""
    import subprocess

    from smallem.tools import bench_attention

    Path(path).unlink(missing_ok=True)  # no earlier run's choices
    try:
        subprocess.run([sys.executable, __file__, "variants", path, *sys.argv[3:4]],
                       timeout=float(os.environ.get("VARIANTS_S", "200")))
    except subprocess.TimeoutExpired:
        print("variants: out of time", flush=True)
    best = json.loads(Path(path).read_text())["best"] if Path(path).exists() else {}
    adopt(best)
    print(f"adopted: TC {attention_f32_tc.TC}, TCB {attention_f32_tc_grad.TCB}, FROM "
          f"{attention_f32_tc_grad.FROM}", flush=True)
    rows = bench_attention.attention_rows("gpu", True, print, ROWS, LENGTHS, ("fp32",))
    record = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    record["bench"], record["adopted"] = rows, best
    Path(path).write_text(json.dumps(record, indent=1, default=str))


def profile(d: int = 128, t: int = 4096) -> None:
    """One forward and one backward of TC's, TCB's tiles at width d, length t (the bench's shape),
    for ncu (r13-f32_device.sh profile)."""
    import cupy
    import numpy as np

    b = TOKENS // t
    rng = np.random.default_rng(t + d)
    q, k, v, g = (cupy.asarray(rng.normal(size=(b, HEADS, t, d)), dtype=np.float32) for _ in range(4))
    out, lse = cupy.empty_like(q), cupy.empty((b, HEADS, t, 1), np.float32)
    attention_f32_tc.forward(q, k, v, out, lse, (b, HEADS), 1 / np.sqrt(d), True)
    grads = (cupy.empty_like(q), cupy.empty_like(k), cupy.empty_like(v))
    attention_f32_tc_grad.backward(q, k, v, g, out, lse, grads, (b, HEADS), 1 / np.sqrt(d), True)
    cupy.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "cubins":
        cubins.compile_all(sys.argv[2], sources())
    elif mode in ("tests", "broken"):
        import pytest

        args = sys.argv[4:]  # after CUBINS (or "--") and "--"
        if sys.argv[2] != "--":
            cubins.install(sys.argv[2])
        if mode == "broken":
            broken()
        sys.exit(pytest.main(["-o", "addopts=", "-p", "no:cacheprovider", "-q", *args]))
    else:
        if len(sys.argv) > 3:
            cubins.install(sys.argv[3])
        {"variants": variants, "bench": bench, "profile": lambda _: profile()}[mode](sys.argv[2])

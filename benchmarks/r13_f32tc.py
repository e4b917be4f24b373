"""Round 13, issue 37: the float32 attention's 3xTF32 kernels (backends/cuda/attention_f32_tc.py)
on the device, and their modules built here first.
  python benchmarks/r13_f32tc.py cubins DIR   (here: nvcc, every module the call loads)
  python benchmarks/r13_f32tc.py variants OUT.json [CUBINS]   (device)
  python benchmarks/r13_f32tc.py bench OUT.json [CUBINS]   (device: variants, then the rows)
  python benchmarks/r13_f32tc.py tests|broken CUBINS|-- -- PYTEST_ARGS   (device: pytest; broken:
  with the small terms cut)
variants: each of VARIANTS' forward tiles checked against float64 (small shapes) and timed at
the bench's shapes (causal, H 8, B·T 32,768, T 512 … 4,096; median of 20 by device events)
beside attention_f32.py's FFMA forward and PyTorch's float32 SDPA forward; the fastest at every T
(of those within 1e-5 of float64) is printed as the TC to adopt, and set in this process.
bench: then `smallem bench --attention`'s float32 rows at D 32, 64, 128 beside PyTorch's
(bench_attention.attention_rows, captured), into OUT.json's "bench". broken: the 3xTF32 products
without their two small terms (one TF32 product): the tests given must fail.
"""

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cubins  # noqa: E402

from smallem.backends.cuda import all_sources, attention_f32_tc  # noqa: E402

VARIANTS = {64: [(4, 32, 0, 1), (8, 32, 0, 1), (4, 64, 0, 1), (2, 32, 0, 1)],
            128: [(8, 32, 0, 0), (8, 32, 0, 1), (4, 32, 0, 0), (8, 16, 0, 0)]}
LENGTHS = (512, 1024, 2048, 4096)
HEADS, TOKENS, REPS = 8, 32_768, 20


def broken() -> None:
    """attention_f32_tc's products as one TF32 product each: its float64 tests must fail."""
    attention_f32_tc.KERNELS = attention_f32_tc.KERNELS.replace(
        "mma_tf32(c, as, bb[0], bb[1]);\n    mma_tf32(c, ab, bs[0], bs[1]);\n", "")
    attention_f32_tc.width_source.cache_clear()


def sources() -> set[str]:
    out = set(all_sources().values())
    kernels = attention_f32_tc.KERNELS
    broken()
    out |= {attention_f32_tc.width_source(d, tiles) for d, tiles in attention_f32_tc.TC.items()}
    attention_f32_tc.KERNELS = kernels
    attention_f32_tc.width_source.cache_clear()
    out |= {attention_f32_tc.width_source(d, tiles) for d, tries in VARIANTS.items() for tiles in tries}
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


def _reference(q, k, v, causal):
    import numpy as np

    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def variants(path: str) -> dict:
    import cupy
    import numpy as np

    from smallem.backends.cuda import attention_f32

    rows, best, checked = [], {}, {}
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        torch = None
    for d, tries in VARIANTS.items():
        errors = {}
        for tiles in tries:  # against float64: O at odd shapes, causal and not
            attention_f32_tc.TC[d] = tiles
            worst = 0.0
            for b, h, t, s, causal in ((1, 2, 333, 333, True), (2, 3, 70, 90, False), (1, 1, 1, 1, True)):
                rng = np.random.default_rng(t)
                xs = [rng.normal(size=(b, h, n, d)) for n in (t, s, s)]
                q, k, v = (cupy.asarray(x, dtype=np.float32) for x in xs)
                out, lse = cupy.empty_like(q), cupy.empty((b, h, t, 1), np.float32)
                attention_f32_tc.forward(q, k, v, out, lse, (b, h), 1 / np.sqrt(d), causal)
                ref = _reference(*xs, causal)
                worst = max(worst, float(np.linalg.norm(cupy.asnumpy(out) - ref) / np.linalg.norm(ref)))
            errors[tiles] = checked[f"{d} {tiles}"] = worst
            print(f"D {d} {tiles}: O against float64 {worst:.2e}", flush=True)
        times: dict = {}
        for t in LENGTHS:
            b = TOKENS // t
            rng = np.random.default_rng(t + d)
            q, k, v = (cupy.asarray(rng.normal(size=(b, HEADS, t, d)), dtype=np.float32) for _ in range(3))
            out, lse = cupy.empty_like(q), cupy.empty((b, HEADS, t, 1), np.float32)
            args = (q, k, v, out, lse, (b, HEADS), 1 / np.sqrt(d), True)
            row = {"D": d, "T": t, "ffma": _time(lambda: attention_f32.forward(*args))}
            for tiles in tries:
                attention_f32_tc.TC[d] = tiles
                row[str(tiles)] = _time(lambda: attention_f32_tc.forward(*args))
            if torch is not None:
                tq, tk, tv = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
                row["torch_fwd"] = _time(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True))
                del tq, tk, tv
            rows.append(row)
            print(json.dumps(row), flush=True)
            for tiles in tries:
                times.setdefault(tiles, []).append(row[str(tiles)])
        good = [x for x in tries if errors[x] < 1e-5]
        # the fastest at every T if one is; else the least summed time
        best[d] = min(good, key=lambda x: sum(times[x])) if good else tries[0]
        attention_f32_tc.TC[d] = best[d]
        print(f"D {d}: adopt {best[d]}", flush=True)
    Path(path).write_text(json.dumps({"rows": rows, "best": {str(d): x for d, x in best.items()},
                                      "errors": checked}, indent=1))
    return best


def bench(path: str) -> None:
    from smallem.tools import bench_attention

    best = variants(path)
    rows = bench_attention.attention_rows("gpu", True, print, (32, 64, 128), LENGTHS, ("fp32",))
    record = json.loads(Path(path).read_text())
    record["bench"], record["tc"] = rows, {str(d): x for d, x in best.items()}
    Path(path).write_text(json.dumps(record, indent=1, default=str))


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
        {"variants": variants, "bench": bench}[mode](sys.argv[2])

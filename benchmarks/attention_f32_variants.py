"""Issue 37's float32 flash attention (backends/cuda/attention_f32.py) on a GPU, in one process:
each tile configuration checked against float64 at small shapes, its forward and backward timed
apart at each T of SPLIT (eager, device events), per width and kind the fastest of those faster
than CONFIG's (TRIES' first) at every T taken, then `smallem bench --attention`'s float32 rows
(captured) for it beside the row kernels, the unfused chain and PyTorch's SDPA:
`python benchmarks/attention_f32_variants.py OUT.json [widths]`. B·T = 32,768, 8 heads, causal.
TRIES=0 skips the search (CONFIG as it is); LENGTHS="2048 4096" narrows the bench rows, SPLIT
the split timings' T; LEAN=1 leaves the row kernels and the unfused chain out of the bench rows.
"""

import functools
import json
import os
import sys
import time

import cupy
import numpy as np

from smallem.autodiff.attention import Attention
from smallem.backends import get_backend
from smallem.backends.cuda import attention, attention_f32
from smallem.tools import bench_attention as bench
from smallem.tools.bench import machine

sys.path.insert(0, "benchmarks")
from attention_mma_variants import reference  # noqa: E402  (the float64 attention and its gradients)
from attention_variants import timed  # noqa: E402

TOKENS, HEADS = 32_768, 8
# per width: (forward tiles, backward tiles), each (BM, BN, NT[, blocks a multiprocessor holds
# (0: no cap)[, KX threads across the keys[, QB query buffers[, DL dK/dV layout, backward]]]]);
# the first is CONFIG. Round 11 (results/round11/attention_f32.md): QB = 3 at every width (the
# next query tile's Q, dO, lse, δ issued into the one buffer during dQ's product: round 9's
# profile had the 12.5 %-occupancy backward waiting on shared loads with no warp to switch to, and
# QB = 1 waits for each tile's copies at a barrier), and forwards of three blocks a multiprocessor
# (D 128: 16 keys a tile, 73.7 KB, 168 registers; D 64: 32 keys, 62.5 KB, 162 registers), and
# SP = 2, 4 (S, then dP, each in a pass of its own over D: never adopted, deleted in round 13).
# Each emulator-checked against float64 (emulate_f32_attention.py, tests/test_attention_f32_
# emulated.py); registers from nvcc -Xptxas -v, none spilled but D 64's backward (16 bytes, as
# CONFIG's). Round 9's candidates (KX 8, QB 2, DL 2, 3, BM 128, NT 512): results/round9/.
TRIES = {32: [((64, 64, 128, 2), (64, 64, 256, 2)), ((64, 64, 128, 2), (64, 64, 256, 2, 16, 3))],
         64: [((64, 64, 128, 2, 8), (64, 64, 256, 2)), ((64, 64, 128, 2, 8), (64, 64, 256, 2, 16, 3)),
              ((64, 32, 128, 3, 8), (64, 64, 256, 2, 16, 3))],
         128: [((64, 32, 128, 2, 8), (64, 64, 256, 0, 16)), ((64, 32, 128, 2, 8), (64, 64, 256, 0, 16, 3)),
               ((64, 16, 128, 3, 8), (64, 64, 256, 0, 16, 3))]}
SPLIT = tuple(int(n) for n in os.environ.get("SPLIT", "512 1024 2048 4096").split())
CHECKS = [(1, 2, 100, 100, True), (2, 1, 50, 70, False), (1, 2, 257, 257, True), (1, 1, 2, 2, True),
          (1, 2, 600, 600, True)]  # 600: QB = 2 walks 19 query tiles of 32 rows through its buffers


def passes(be, q, k, v, g, causal=True):
    """(forward, backward) closures on (B, H, T, D) device arrays through attention.py."""
    op = Attention(causal=causal)
    out = attention.attention_forward(be, q, k, v, op)
    return (lambda: attention.attention_forward(be, q, k, v, op),
            lambda: attention.attention_rule(be, g, out, q, k, v, op), out, op)


def errors(be, d) -> list[float]:
    """max over CHECKS of ‖error‖ / ‖float64‖ for O, dQ, dK, dV (heads as strided views)."""
    worst = [0.0] * 4
    for b, h, t, s, causal in CHECKS:
        rng = np.random.default_rng(t + d)
        xs = [rng.normal(size=(b, n, h, d)) for n in (t, s, s, t)]
        dev = [cupy.asarray(x, dtype=np.float32).transpose(0, 2, 1, 3) for x in xs]
        op = Attention(causal=causal)
        out = attention.attention_forward(be, *dev[:3], op)
        grads = attention.attention_rule(be, dev[3], out, *dev[:3], op)
        ref = reference(*(x.swapaxes(1, 2) for x in xs), causal)
        for i, (a, r) in enumerate(zip([out, *grads], ref)):
            a = cupy.asnumpy(a)
            e = np.linalg.norm(a - r) / max(np.linalg.norm(r), 1.0)
            worst[i] = max(worst[i], float(e) if np.isfinite(a).all() else float("inf"))
    return worst


@functools.cache
def inputs(t: int, d: int) -> tuple:
    """q, k, v, dO at (B, H, T, D), normal, drawn on the device once per shape (every variant
    times the same data)."""
    rng = cupy.random.RandomState(t + d)
    return tuple(rng.standard_normal((TOKENS // t, HEADS, t, d), dtype=np.float32) for _ in range(4))


def split(be, t, d, forward=True) -> tuple[float | None, float]:
    """(forward ms or None where not asked, backward ms) at T = t, eager, median of 5."""
    fwd, bwd, *_ = passes(be, *inputs(t, d))
    return timed(fwd, 5) if forward else None, timed(bwd, 5)


def sdpa_split(t: int, d: int) -> tuple[float, float] | None:
    """PyTorch's float32 SDPA (its default choice) at T = t: (forward ms, backward ms) apart,
    eager, device events, median of 5 after one warm-up; the same inputs as `inputs`."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    q, k, v, g = (torch.as_tensor(x, device="cuda") for x in inputs(t, d))
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    times = []
    for fn in (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
               lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True)):
        fn()
        ms = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms.append(start.elapsed_time(end))
        times.append(sorted(ms)[2])
    return times[0], times[1]


def adopted(rows: list[dict], kind: str, base: tuple) -> tuple:
    """The tiles of `kind` to take: the fastest (sum over SPLIT) of those matching float64 and
    faster than `base`'s (CONFIG's) at every T, else `base`."""
    ms = {}
    for row in rows:
        if max(row["errors_o_dq_dk_dv"]) < 1e-5:
            ms.setdefault(tuple(row[kind]), [row[f"{kind}_ms_{t}"] for t in SPLIT])
    if tuple(base) not in ms:
        return base
    faster = [tiles for tiles, times in ms.items()
              if all(a < b for a, b in zip(times, ms[tuple(base)]))]
    return min(faster, key=lambda tiles: sum(ms[tiles]), default=base)


def save(path: str, record: dict) -> None:
    """The record so far (a call stopped at its limit still leaves what it measured)."""
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


def main() -> None:
    widths = tuple(int(w) for w in sys.argv[2:]) or (32, 64, 128)
    if os.environ.get("CUBINS"):  # the kernels nvcc compiled before the call (benchmarks/cubins.py)
        import cubins

        cubins.install(os.environ["CUBINS"])
    be = get_backend("gpu", "fp32")
    record = {"variants": [], "chosen": {}, "bench": [], "machine": machine(), "split_t": SPLIT}
    default_config = {d: dict(c) for d, c in attention_f32.CONFIG.items()}
    attention.FLOAT32 = "flash"
    chosen = {}
    for d in widths:
        forwards = {}  # forward tiles -> ms per T (the forward does not depend on the backward's)
        rows = []
        for fwd_tiles, bwd_tiles in TRIES[d] if os.environ.get("TRIES", "1") != "0" else []:
            if not (attention_f32.fits("forward", d, fwd_tiles)
                    and attention_f32.fits("backward", d, bwd_tiles)):
                print("does not fit:", d, fwd_tiles, bwd_tiles)
                continue
            attention_f32.CONFIG = {**default_config, d: {"forward": fwd_tiles,
                                                            "backward": bwd_tiles}}
            attention_f32.SOURCE = attention_f32.source({d: attention_f32.CONFIG[d]})
            start = time.perf_counter()
            row = {"D": d, "forward": fwd_tiles, "backward": bwd_tiles}
            try:  # a variant that fails to compile or launch is recorded and passed over
                row["errors_o_dq_dk_dv"] = errors(be, d)
                row["first_call_s"] = time.perf_counter() - start
                for t in SPLIT:
                    known = forwards.get(fwd_tiles, {}).get(t)
                    fwd_ms, row[f"backward_ms_{t}"] = split(be, t, d, forward=known is None)
                    row[f"forward_ms_{t}"] = known if known is not None else fwd_ms
                    forwards.setdefault(fwd_tiles, {})[t] = row[f"forward_ms_{t}"]
            except Exception as e:  # noqa: BLE001 - CuPy's compile and launch errors vary
                row["failed"] = f"{type(e).__name__}: {e}"[:300]
                print(row, flush=True)
                record["variants"].append(row)
                continue
            rows.append(row)
            record["variants"].append(row)
            print(row, flush=True)
            save(sys.argv[1], record)
        if rows:
            chosen[d] = {kind: adopted(rows, kind, default_config[d][kind])
                         for kind in ("forward", "backward")}
        for t in SPLIT:  # PyTorch's forward and backward apart, beside the variants' (round 11)
            found = sdpa_split(t, d)
            if found:
                record.setdefault("sdpa_split", []).append({"D": d, "T": t, "forward_ms": found[0],
                                                            "backward_ms": found[1]})
                print("sdpa split", d, t, found, flush=True)
        save(sys.argv[1], record)
    if os.environ.get("TRIES", "1") == "0":
        chosen = {d: default_config[d] for d in widths}
    record["chosen"] = {str(d): c for d, c in chosen.items()}
    print("chosen:", chosen, flush=True)
    attention_f32.CONFIG = {**default_config, **chosen}
    attention_f32.SOURCE = attention_f32.source(attention_f32.CONFIG)
    for d in chosen:
        record["chosen"][f"errors_{d}"] = errors(be, d)
        print("chosen errors", d, record["chosen"][f"errors_{d}"], flush=True)
    bench.REPS = 5
    for t in (int(n) for n in os.environ.get("LENGTHS", "512 1024 2048 4096").split()):
        for d in chosen:
            b = TOKENS // t
            found = []
            lean = os.environ.get("LEAN") == "1"
            for switch in ("flash",) if lean else ("flash", "rows"):
                attention.FLOAT32 = switch
                found.append({**bench._smallem_row(be, True, b, t, d), "kernels": switch})
            if not lean:
                found.append(bench._unfused_row(be, b, t, d))
            found.append(bench._torch_row("gpu", b, t, d, "fp32"))
            sdpa = found[-1]
            for r in filter(None, found):
                r.update({"B": b, "H": HEADS, "T": t, "D": d, "dtype": "fp32",
                          "tflops": bench.flops(b, t, d) / (r["ms"] * 1e-3) / 1e12,
                          "vs_sdpa": r["ms"] / sdpa["ms"] if sdpa else None})
                record["bench"].append(r)
                print(bench.format_row(r), r.get("kernels", ""), flush=True)
            bench._release("gpu")
            save(sys.argv[1], record)


if __name__ == "__main__":
    main()

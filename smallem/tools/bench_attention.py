"""`smallem bench --attention`: what the fused attention buys, in time and in memory (issue 29).

Attention forward + backward alone, causal, B·T fixed, H = 8 heads of width 32, 64 and 128, T
from 512 to 4,096 (issue 37), in each precision beside PyTorch's SDPA in the same precision:
float32 (smallem fused and unfused; PyTorch's default choice, its memory-efficient kernel), bf16
and fp16 (smallem's tensor-core kernels; PyTorch's default choice, and its flash and cuDNN kernels
named). Each is captured in a CUDA graph and replayed, timed by device events (median); TFLOP/s
by FlashAttention's count (forward 4·B·H·T²·D, halved when causal; backward 2.5 times that).
Memory: what the tape keeps for backward against what autograd saves (inputs left out of both),
and the device memory one forward + backward takes beyond its inputs. Then the Transformer step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..autodiff import Tape, attention
from ..autodiff.operations import softmax
from ..backends import get_backend, gpu_available

TOKENS = {"gpu": 32_768, "cpu": 1_024}  # B·T of the attention rows
LENGTHS = {"gpu": (512, 1024, 2048, 4096), "cpu": (64, 128, 256)}
WIDTHS = {"gpu": (32, 64, 128), "cpu": (32,)}
PRECISIONS = {"gpu": ("fp32", "bf16", "fp16"), "cpu": ("fp32",)}
HEADS = 8
REPS = 20
STEP_LENGTHS = (512, 1024)  # the Transformer step's T, at B·T = 4,096
STEP_TOKENS = 4096


def _inputs(be: Any, b: int, t: int, d: int, seed: int) -> list[Any]:
    """q, k, v, dO (B, H, T, D), contiguous (a leaf takes a strided array by copying it)."""
    rng = np.random.default_rng(seed)
    return [be.tensor(rng.normal(size=(b, HEADS, t, d))) for _ in range(4)]


def smallem_pass(be: Any, fused: bool, q: Any, k: Any, v: Any, g: Any) -> Callable[[], Tape]:
    """One forward + backward on a new tape: the fused node, or the Transformer's unfused chain."""
    scale = be.tensor(1.0 / np.sqrt(be.shape(q)[-1]))  # on the device before any capture

    def run() -> Tape:
        tape = Tape(be)
        lq, lk, lv = (tape.leaf(x) for x in (q, k, v))
        if fused:
            y = attention(tape, lq, lk, lv)
        else:
            y = softmax(tape, tape.mul(lq @ tape.transpose(lk, -2, -1), scale), causal=True) @ lv
        tape.backward(y, grad=g)
        return tape

    return run


def _device_timer(be: Any, run: Callable[[], Any]) -> tuple[float, str]:
    """Median ms of `run` replayed from a CUDA graph (or eager, if it cannot be captured)."""
    import cupy

    run()
    be.synchronize()
    how, replay = "graph", None
    try:
        stream = cupy.cuda.Stream()
        with be.capture(stream) as graph:
            run()
        replay = lambda: graph[0].launch(stream=stream)  # noqa: E731
    except Exception as error:  # noqa: BLE001 - recorded in the row
        how, stream = f"eager ({type(error).__name__})", cupy.cuda.get_current_stream()
        replay = run
    times = []
    for _ in range(REPS + 3):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        replay()
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times[3:]), how


def _host_timer(run: Callable[[], Any]) -> tuple[float, str]:
    run()
    times = []
    for _ in range(max(3, REPS // 4)):
        start = time.perf_counter()
        run()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times), "eager"


def flops(b: int, t: int, d: int, causal: bool = True) -> float:
    """Forward + backward by FlashAttention's count: 4·B·H·T²·D forward (two products), halved
    when causal, and 2.5 times that backward."""
    return 3.5 * 4 * b * HEADS * t * t * d * (0.5 if causal else 1.0)


def _smallem_row(be: Any, fused: bool, b: int, t: int, d: int) -> dict[str, Any]:
    run = smallem_pass(be, fused, *_inputs(be, b, t, d, seed=t + d))
    tape = run()
    report = tape.memory()
    row = {"impl": f"smallem {'fused' if fused else 'unfused'}", "saved_bytes": report.kept}
    if be.name == "gpu":
        import cupy

        pool = cupy.cuda.MemoryPool()  # a fresh pool grows to what the pass needs at once
        with cupy.cuda.using_allocator(pool.malloc):
            run()
            be.synchronize()
        row["device_bytes"] = int(pool.total_bytes())
        del pool
        row["ms"], row["timing"] = _device_timer(be, run)
    else:
        row["device_bytes"] = report.peak
        row["ms"], row["timing"] = _host_timer(run)
    return row


def _unfused_row(be: Any, b: int, t: int, d: int) -> dict[str, Any] | None:
    """The unfused chain, or None where its (T, T) matrices do not fit in the device's memory."""
    try:
        return _smallem_row(be, False, b, t, d)
    except MemoryError:  # CuPy's OutOfMemoryError is one
        be.synchronize()
        return None


def _torch_row(device: str, b: int, t: int, d: int, precision: str = "fp32",
               kernel: str | None = None) -> dict[str, Any] | None:
    """PyTorch's SDPA in `precision`: its default choice, or the one `kernel` names (flash,
    cudnn, efficient: torch.nn.attention.sdpa_kernel). None where it cannot run here."""
    try:
        import contextlib

        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    dev = torch.device("cuda" if device == "gpu" else "cpu")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    choice = {None: None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}[kernel]
    rng = np.random.default_rng(t + d)
    q, k, v, g = (torch.tensor(rng.normal(size=(b, HEADS, t, d)), dtype=dtype,
                               device=dev) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    inputs = {x.untyped_storage().data_ptr() for x in (q, k, v, g)}
    saved: dict[int, int] = {}

    def pack(x: Any) -> Any:
        ptr = x.untyped_storage().data_ptr()
        if ptr not in inputs:
            saved[ptr] = x.untyped_storage().nbytes()
        return x

    def run() -> Any:
        with sdpa_kernel([choice]) if choice else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return torch.autograd.grad(out, (q, k, v), g)

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            run()
    except RuntimeError:  # this kernel does not take this precision or shape
        return None
    row = {"impl": f"PyTorch SDPA {kernel or 'default'}", "saved_bytes": sum(saved.values())}
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        row["device_bytes"] = torch.cuda.max_memory_allocated() - base
        replay, row["timing"] = run, "eager"
        try:  # as an expert runs it: warmed up on a side stream, then one CUDA graph
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            replay, row["timing"] = graph.replay, "graph"
        except Exception as error:  # noqa: BLE001 - recorded in the row
            row["timing"] = f"eager ({type(error).__name__})"
        times = []
        for _ in range(REPS + 3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        row["ms"] = statistics.median(times[3:])
        if precision == "fp32":
            row["kernels"] = _kernels_seen(run)
    else:
        row["device_bytes"] = None
        row["ms"], row["timing"] = _host_timer(run)
    return row


def _kernels_seen(run: Callable[[], Any]) -> list[str]:
    """The attention kernels (names with fmha, attention or flash; every kernel where none has)
    that one eager call of `run` launches, as torch.profiler saw them: the float32 rows' units are
    read from these, not assumed."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    mine = {n for n in names if any(w in n.lower() for w in ("fmha", "attention", "flash"))}
    return sorted(mine or names)


def attention_rows(device: str, torch: bool = True, log: Callable[[str], Any] | None = None,
                   widths: tuple[int, ...] | None = None, lengths: tuple[int, ...] | None = None,
                   precisions: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The rows, each precision beside PyTorch's SDPA in it: `vs_sdpa` against PyTorch's default
    choice, `vs_torch_best` against its fastest kernel there."""
    rows = []
    for d in widths or WIDTHS[device]:
        for t in lengths or LENGTHS[device]:
            b = TOKENS[device] // t
            for precision in precisions or PRECISIONS[device]:
                be = get_backend("gpu" if device == "gpu" else "cpu", precision)
                shape = {"B": b, "H": HEADS, "T": t, "D": d, "dtype": precision}
                found = [_smallem_row(be, True, b, t, d)]
                if precision == "fp32":  # the unfused chain in bf16 would hold T × T in float32
                    found.append(_unfused_row(be, b, t, d))
                    # its (T, T) blocks stay in CuPy's pool: round 11's D 128, T 4,096 left PyTorch's
                    # row out of memory (no row) until they were given back first
                    _release(device)
                if torch:
                    # float32: the default is the memory-efficient kernel (round6/, call 1)
                    kernels = (None,) if device != "gpu" or precision == "fp32" else \
                        (None, "flash", "cudnn")
                    found += [_torch_row(device, b, t, d, precision, kernel) for kernel in kernels]
                sdpa = next((r for r in found if r and r["impl"] == "PyTorch SDPA default"), None)
                best = min((r["ms"] for r in found if r and r["impl"].startswith("PyTorch")),
                           default=None)
                for r in filter(None, found):
                    r.update(shape, units=units(device, precision, d, t, r["impl"], r.get("kernels")))
                    r["tflops"] = flops(b, t, d) / (r["ms"] * 1e-3) / 1e12
                    r["vs_sdpa"] = r["ms"] / sdpa["ms"] if sdpa else None
                    r["vs_torch_best"] = r["ms"] / best if best else None
                    r["saved_vs_sdpa"] = r["saved_bytes"] / sdpa["saved_bytes"] \
                        if sdpa and sdpa["saved_bytes"] else None
                    rows.append(r)
                    if log:
                        log(format_row(r))
                be.synchronize()
                _release(device)
    return rows


def units(device: str, precision: str, d: int, t: int, impl: str,
          kernels: list[str] | None = None) -> str:
    """The units a row's products run on: float32 on the GPU, smallem's fused kernels' choice
    (FFMA, or 3xTF32: backends/cuda/attention.float32_units), its unfused chain's cuBLAS SGEMM
    (FFMA), PyTorch's SDPA from the kernels the profiler saw it launch (`kernels`): CUTLASS's
    float32 fmha kernels (fmha_cutlassF_f32_…, fmha_cutlassB_f32_…) run 3xTF32 on sm80 and later
    (their Mma is OpMultiplyAddFastF32: float32 split into two TF32 parts, three tensor-core
    products; the row keeps the names seen), other names are given as seen, and where none were
    seen the row says the 3xTF32 is assumed; bf16, fp16 the tensor cores."""
    if device != "gpu":
        return "CPU"
    if precision != "fp32":
        return f"{precision} tensor cores"
    if impl == "smallem fused":
        from ..backends.cuda import attention as cuda_attention

        return cuda_attention.float32_units(d, t)
    if not impl.startswith("PyTorch"):
        return "FFMA"
    if not kernels:
        return "3xTF32 (assumed: no kernels profiled)"
    if any("cutlass" in k and "f32" in k for k in kernels):
        return "3xTF32"
    return "seen: " + ", ".join(kernels)


def _release(device: str) -> None:
    """Give back what the rows cached: the captured graphs' pools (after the tapes' cycles are
    collected), CuPy's and PyTorch's caches. Round 6's run ran out of the H200's 140 GB without
    it, the two caching allocators each holding what the other needed."""
    if device != "gpu":
        return
    import gc

    import cupy

    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    try:
        import torch

        torch.cuda.empty_cache()
    except ImportError:
        pass


def format_row(r: dict[str, Any]) -> str:
    ratio = f"{r['vs_sdpa']:.2f}x" if r.get("vs_sdpa") else "-"
    best = f"{r['vs_torch_best']:.2f}x" if r.get("vs_torch_best") else "-"
    saved = f"{r['saved_vs_sdpa']:.2f}x" if r.get("saved_vs_sdpa") else "-"
    dev = f"{r['device_bytes'] / 2**20:9.1f}" if r.get("device_bytes") else f"{'-':>9}"
    return (f"{r['impl']:<22} D={r['D']:<3} T={r['T']:<5} B={r['B']:<4} {r['dtype']:<5} "
            f"{r['ms']:9.3f} ms {r.get('tflops', 0):6.1f} TFLOP/s {ratio:>7} {best:>7}  saved "
            f"{r['saved_bytes'] / 2**20:8.2f} MiB {saved:>7}  device {dev} MiB  ({r['timing']})"
            + (f"  [{r['units']}]" if r.get("units") else ""))


def step_rows(torch: bool = True, log: Callable[[str], Any] | None = None) -> list[dict[str, Any]]:
    """The whole Transformer training step (AdamW, captured) at T 512 and 1,024, B·T = 4,096:
    smallem fused, unfused, fused with checkpointed blocks; PyTorch's CUDA graph, SDPA or not."""
    from ..data import load_corpus
    from ..models.transformer import Transformer, TransformerConfig
    from ..optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
    from ..training.step import make_step
    from .bench import Runner, sequence_batches, time_all
    from .bench_reference import TorchTransformer

    be, rows = get_backend("gpu"), []
    data = load_corpus(None)
    for t in STEP_LENGTHS:
        batch = STEP_TOKENS // t
        batches = sequence_batches(data.train, batch, t, 8, 0)
        impls: list[tuple[str, Any, Any]] = []
        for name, kw in (("smallem fused", {"attention": "fused"}),
                         ("smallem unfused", {"attention": "unfused"}),
                         ("smallem fused, checkpointed", {"attention": "fused",
                                                          "checkpoint_blocks": True})):
            model = Transformer(TransformerConfig(context=t, **kw), be, seed=0)
            tape = Tape(be)
            model.loss(tape, *batches[0])
            tape.close()
            kept = tape.memory().kept
            step = make_step(be, model, AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY))
            impls.append((name, Runner(step, be.synchronize, batches), kept))
        if torch:
            for sdpa in (True, False):
                net = TorchTransformer(Transformer(TransformerConfig(context=t), "cpu64", seed=0),
                                       "cuda", lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY,
                                       graph=True, sdpa=sdpa)
                impls.append((f"PyTorch CUDA graph{', SDPA' if sdpa else ''}",
                              Runner(net.step, net.synchronize, batches), None))
        time_all([r for _, r, _ in impls], warmup=20, steps=200, block=20)
        best = min((statistics.median(r.seconds) for n, r, _ in impls if n.startswith("PyTorch")),
                   default=None)
        for name, runner, kept in impls:
            ms = 1e3 * statistics.median(runner.seconds)
            row = {"impl": name, "T": t, "B": batch, "dtype": "float32", "ms": ms,
                   "vs_torch_best": ms / (1e3 * best) if best else None, "kept_bytes": kept}
            rows.append(row)
            if log:
                ratio = f"{row['vs_torch_best']:.2f}x" if best else "-"
                kept_text = f"  kept {kept / 2**20:8.1f} MiB" if kept else ""
                log(f"step {name:<30} T={t:<5} B={batch:<3} float32 {ms:8.3f} ms {ratio:>7}"
                    f"{kept_text}")
    return rows


def main(json_path: str | None = None, torch: bool = True) -> int:
    device = "gpu" if gpu_available() else "cpu"
    print(f"attention forward + backward, causal, {HEADS} heads, B·T = {TOKENS[device]:,} on "
          f"{device}; ratios to PyTorch SDPA's default, then to its fastest kernel (same "
          "precision)", flush=True)
    result: dict[str, Any] = {"device": device, "attention": attention_rows(device, torch, print)}
    if device == "gpu":
        result["step"] = step_rows(torch, print)
    from .bench import machine

    result["machine"] = machine()
    if json_path:
        from ..files import write_json

        write_json(json_path, result)
    return 0

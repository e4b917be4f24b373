"""`smallem bench`: the time of one training step (AdamW) on every backend here.

The MLP (batch 256): each smallem backend side by side, in one process, with the same model
written by hand without autograd (bench_reference.py: NumPy, CuPy) and in PyTorch when it is
installed (eager, and replayed as a CUDA graph on a GPU). The Transformer (`model="transformer"`,
batch 64 × 64 bytes): smallem plain and captured against PyTorch eager and CUDA graph, each with
attention written out and with F.scaled_dot_product_attention. All start from the same weights
and see the same batches. Timing: warm-up steps first, then blocks of steps closed by a device sync before the
clock is read; the table gives the median time per step and ratios to the references.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from ..backends import get_backend, gpu_available
from ..data import BatchSampler, SequenceSampler, load_corpus
from ..models.protocol import LanguageModel
from ..nn import built_for_speed
from ..optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
from ..training import registry
from ..training.step import make_step
from .bench_isolated import ROUNDS, cpu_words, measured, time_rows
from .bench_reference import HandMlp, TorchMlp, TorchTransformer
from .bench_table import BenchResult, Row, format_table, plan_words, ratios  # noqa: F401 - bench's face
from .calls import GPU_FUSED, NO_LAUNCH, CallCounter, step_calls  # noqa: F401 - bench's face

STEPS = 500  # timed steps per row
WARMUP = 50  # untimed steps first
BLOCK = 50  # steps between two device syncs; the median is over blocks
BENCHED = ("mlp", "transformer")  # the models with references (by hand, PyTorch) to time against


def bench_config(model: str, device: str) -> Any:
    """The config bench times `model` in on `device`: the registry's size; on the CPU with the
    fused attention (backends/cpu/attention.py), as PyTorch's SDPA row runs its own. ("auto"
    stays unfused on the CPU, where lesson 12 reads the weights; the calls notebook 10 counts
    are the registry's.)"""
    config = registry.get(model).bench_config(device)
    if device == "cpu" and getattr(config, "attention", None) == "auto":
        config = replace(config, attention="fused")
    return config


def build(model: str, backend: Any, seed: int, device: str = "gpu") -> LanguageModel:
    """Registered model `model` at the size bench times on `device`, from `seed`: the same
    weights on every backend; on the CPU built for speed (its Linears fused: nn.built_for_speed)."""
    built = registry.get(model).build(bench_config(model, device), backend, seed)
    return built_for_speed(built) if device == "cpu" else built


def sequence_batches(tokens: np.ndarray, batch: int, context: int, count: int, seed: int
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """`count` batches as training draws them: inputs (B, T) and the next byte at every
    position (B, T)."""
    sampler = SequenceSampler(tokens, batch, context, seed=seed)
    return [sampler.next() for _ in range(count)]


# what runs ------------------------------------------------------------------------------------
# PyTorch's rows in a lower precision (their dtype column names it); float32 rows run TF32 off
LOWER = (("tf32", "TF32"), ("bf16", "bf16 autocast"))
Step = Callable[[np.ndarray, np.ndarray], Any]  # (contexts, targets) -> loss, unread
Impl = tuple[Step, Callable[[], None], Callable[[Any], float]]  # step, sync, read the loss


def _smallem(backend_name: str, seed: int, capture: bool = False, model_name: str = "mlp"
             ) -> Impl:
    backend = get_backend(backend_name)
    model = build(model_name, backend, seed, "gpu" if backend_name == "gpu" else "cpu")
    optimizer = AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY)
    step = make_step(backend, model, optimizer, capture=capture)
    return step, backend.synchronize, backend.item


def _hand(xp: Any, dtype: str, seed: int) -> Impl:
    mlp = HandMlp(xp, dtype, seed=seed, lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY)
    return mlp.step, mlp.synchronize, float


def _torch(device: str, graph: bool, seed: int, precision: str = "fp32") -> Impl:
    mlp = TorchMlp(device, seed=seed, lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY, graph=graph,
                   precision=precision)
    return mlp.step, mlp.synchronize, lambda loss: float(loss.item())


def _torch_transformer(device: str, graph: bool, sdpa: bool, seed: int, precision: str = "fp32"
                       ) -> Impl:
    model = build("transformer", "cpu64", seed, "gpu" if device == "cuda" else "cpu")
    net = TorchTransformer(model, device, lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY,
                           graph=graph, sdpa=sdpa, precision=precision)
    return net.step, net.synchronize, lambda loss: float(loss.item())


def _torch_devices() -> list[str]:
    try:
        import torch
    except ImportError:
        return []
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def transformer_candidates(torch: bool = True) -> list[tuple[str, str, str, Callable]]:
    """The Transformer's rows: smallem plain and captured, PyTorch as an expert writes it."""
    out: list[tuple[str, str, str, Callable]] = []
    torch_devices = _torch_devices() if torch else []
    t = "transformer"
    if gpu_available():
        out += [("smallem gpu", "gpu", "float32", lambda s: _smallem("gpu", s, False, t)),
                ("smallem gpu, captured", "gpu", "float32",
                 lambda s: _smallem("gpu", s, True, t))]
        if "cuda" in torch_devices:
            for graph in (False, True):
                for sdpa in (False, True):
                    name = ("PyTorch CUDA graph" if graph else "PyTorch eager") + (
                        ", SDPA" if sdpa else "")
                    out.append((name, "gpu", "float32", lambda s, g=graph, a=sdpa:
                                _torch_transformer("cuda", g, a, s)))
            for p, how in LOWER:  # as experts run a small model (smallem's own: --precision)
                out.append((f"PyTorch CUDA graph, SDPA, {how}", "gpu", p,
                            lambda s, p=p: _torch_transformer("cuda", True, True, s, p)))
    out.append(("smallem cpu", "cpu", "float32", lambda s: _smallem("cpu", s, False, t)))
    if "cpu" in torch_devices:  # written-out attention, then SDPA as experts run it on a CPU too
        out.append(("PyTorch eager", "cpu", "float32",
                    lambda s: _torch_transformer("cpu", False, False, s)))
        out.append(("PyTorch eager, SDPA", "cpu", "float32",
                    lambda s: _torch_transformer("cpu", False, True, s)))
    return out


def candidates(torch: bool = True, cpu64: bool = True) -> list[tuple[str, str, str, Callable]]:
    """(name, device, dtype, factory) for every MLP implementation this machine can run."""
    out: list[tuple[str, str, str, Callable]] = []
    torch_devices = _torch_devices() if torch else []
    if gpu_available():
        import cupy

        out += [("smallem gpu", "gpu", "float32", lambda s: _smallem("gpu", s)),
                ("smallem gpu, captured", "gpu", "float32",
                 lambda s: _smallem("gpu", s, capture=True)),
                ("hand-written CuPy", "gpu", "float32", lambda s: _hand(cupy, "float32", s))]
        if "cuda" in torch_devices:  # the strongest a PyTorch user writes: fused AdamW
            out += [("PyTorch eager", "gpu", "float32", lambda s: _torch("cuda", False, s)),
                    ("PyTorch CUDA graph", "gpu", "float32", lambda s: _torch("cuda", True, s))]
            out += [(f"PyTorch CUDA graph, {how}", "gpu", p,
                     lambda s, p=p: _torch("cuda", True, s, p)) for p, how in LOWER]
    out += [("smallem cpu", "cpu", "float32", lambda s: _smallem("cpu", s)),
            ("hand-written NumPy", "cpu", "float32", lambda s: _hand(np, "float32", s))]
    if "cpu" in torch_devices:
        out.append(("PyTorch eager", "cpu", "float32", lambda s: _torch("cpu", False, s)))
    if cpu64:
        out += [("smallem cpu64", "cpu", "float64", lambda s: _smallem("cpu64", s)),
                ("hand-written NumPy", "cpu", "float64", lambda s: _hand(np, "float64", s))]
    return out


# timing ---------------------------------------------------------------------------------------
class Runner:
    """One implementation under test: its step, its sync, and where it is in the batches."""

    def __init__(self, step: Step, synchronize: Callable[[], None], batches: list) -> None:
        self.step, self.synchronize, self.batches = step, synchronize, batches
        self.k, self.loss, self.seconds = 0, None, []

    def run(self, n: int) -> None:
        for _ in range(n):
            self.loss = self.step(*self.batches[self.k % len(self.batches)])
            self.k += 1

    def timed_block(self, block: int) -> None:
        """Seconds per step over `block` steps. The device is synced before the clock is read
        at both ends, so queued GPU work is counted; inside the block the host may run ahead
        of the GPU, as it does in training."""
        self.synchronize()
        start = time.perf_counter()
        self.run(block)
        self.synchronize()
        self.seconds.append((time.perf_counter() - start) / block)


def time_all(runners: list[Runner], warmup: int, steps: int, block: int) -> None:
    """Warm every runner up, then time blocks in turn (A, B, C, A, B, C, ...): a machine
    that gets busier halfway slows every implementation alike, and the ratios hold. The GPU rows
    only: CPU rows leave BLAS and OpenMP threads spinning after each call, which steal the host
    from whatever runs next, so each CPU row runs alone in a process of its own (bench_isolated)."""
    for r in runners:
        r.run(warmup)
    for _ in range(max(1, steps // block)):
        for r in runners:
            r.timed_block(block)


KEY = " | "  # a CPU row's key: its name and dtype (float32 and float64 rows share names)


def row_key(name: str, dtype: str) -> str:
    return f"{name}{KEY}{dtype}"


def _time_row(model: str, key: str, batches: list, plan: tuple[int, int, int],
              seed: int) -> tuple[list[float], float, dict[str, Any]]:
    """In bench_isolated's child: build CPU row `key` (its name, or row_key's name | dtype),
    warm it up, time its blocks (measured)."""
    name, _, dtype = key.partition(KEY)
    torch = name.startswith("PyTorch")  # another row's process never imports torch (seconds, threads)
    pool = transformer_candidates(torch) if model == "transformer" else candidates(torch, True)
    step, synchronize, read = next(c[3] for c in pool if c[0] == name and c[1] == "cpu"
                                   and dtype in ("", c[2]))(seed)
    if name.startswith("smallem"):
        from ..backends.cpu import settle

        settle()  # this run's threads, decided now (SMALLEM_THREADS, --threads, or the machine)
    runner = Runner(step, synchronize, batches)
    warmup, steps, block = plan
    runner.run(warmup)
    info = measured(runner, lambda: [runner.timed_block(block) for _ in range(max(1, steps // block))],
                    name)
    return runner.seconds, read(runner.loss), info


def _cpu_kernels() -> str:
    """The float32 CPU's fused kernels: 'numba 0.68.1' (and what runs on NumPy), or 'numpy'."""
    from ..backends.cpu import compiled

    route = compiled.route()
    if route == "numpy":
        return route
    import numba

    return (f"numba {numba.__version__}" + (", attention on NumPy" if route == "numba-table" else "")
            + ("" if compiled.linear() else ", Linears as NumPy calls"))


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "numpy": np.__version__,
                            "cpu_count": os.cpu_count(), "processor": platform.machine()}
    if gpu_available():
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        info["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        info["cupy"] = cupy.__version__
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    info["cpu kernels"] = _cpu_kernels()
    try:  # the kernels BLAS chose for this CPU: OpenBLAS may pick an older family's (issue 38)
        from threadpoolctl import threadpool_info

        info["blas"] = ", ".join(f"{lib['internal_api']} {lib.get('version') or ''} "
                                 f"{lib.get('architecture') or ''}".strip()
                                 for lib in threadpool_info() if lib["user_api"] == "blas")
    except ImportError:
        pass
    return info


def run_bench(steps: int = STEPS, warmup: int = WARMUP, block: int = BLOCK, batch: int | None = None,
              seed: int = 0, torch: bool = True, cpu64: bool = True, corpus: str | None = None,
              only: Callable[[str, str], bool] | None = None,
              log: Callable[[str], Any] | None = None, model: str = "mlp") -> BenchResult:
    """Time every implementation available here; `only(name, device)` may skip some."""
    data = load_corpus(corpus)
    config: dict[str, Any] = {}
    if model == "transformer":
        entry = registry.get(model)
        batch = batch or entry.batch
        pool = [c for c in transformer_candidates(torch) if only is None or only(c[0], c[1])]
        batches = {d: sequence_batches(data.train, batch, bench_config(model, d).context, 16,
                                       seed) for d in {c[1] for c in pool}}
        config = {d: asdict(bench_config(model, d)) for d in batches}
    else:
        entry = registry.get("mlp")
        batch = batch or entry.batch
        sampler = BatchSampler(data.train, batch, entry.bench_config("cpu").context, seed=seed)
        drawn = [sampler.next() for _ in range(64)]  # drawn once: sampling is not timed
        pool = [c for c in candidates(torch, cpu64) if only is None or only(c[0], c[1])]
        batches = {"gpu": drawn, "cpu": drawn}
    chosen = pool
    timed: dict[tuple[str, str, str], tuple] = {}  # (name, device, dtype) -> seconds, loss, {threads, faults}
    gpu = [c for c in chosen if c[1] == "gpu"]
    if gpu:  # in this process, in turn: the GPU rows' host work is light
        runners, reads = [], []
        for name, _, _, factory in gpu:
            step, synchronize, read = factory(seed)
            runners.append(Runner(step, synchronize, batches["gpu"]))
            reads.append(read)
        if log is not None:
            log(f"timing {len(gpu)} implementations on the gpu: {plan_words(warmup, steps, block)}, "
                "in turn")
        time_all(runners, warmup, steps, block)
        timed.update({(c[0], "gpu", c[2]): (r.seconds, read(r.loss), {})
                      for c, r, read in zip(gpu, runners, reads)})
    cpu = [row_key(c[0], c[2]) for c in chosen if c[1] == "cpu"]  # two hand-written NumPy rows
    if cpu:  # each alone in its own process: no other library's threads beside it
        plan = (warmup, steps, block)
        if model == "transformer":  # ~100x a GPU step: a tenth of the steps
            plan = (min(warmup, 3), max(1, steps // 10), max(1, block // 10))
            config["cpu_timing"] = dict(zip(("warmup", "steps", "block"), plan))
        if log is not None:
            log(f"timing {len(cpu)} implementations on the cpu: {plan_words(*plan)}, each alone in "
                f"a process of its own, in {ROUNDS} rounds")
        timed.update({(key.split(KEY)[0], "cpu", key.split(KEY)[1]): v for key, v in
                      time_rows(_time_row, model, cpu, batches["cpu"], plan, seed, log).items()})
    rows = []
    for name, device, dtype, _ in chosen:
        seconds, loss, info = timed[(name, device, dtype)]
        ms = [1e3 * t for t in seconds]
        q = np.percentile(ms, [10, 90])
        rows.append(Row(name, device, dtype, statistics.median(ms), float(q[0]), float(q[1]), loss,
                        threads=info.get("threads"), faults=info.get("faults")))
        if log is not None:
            log(f"{name} ({device}, {dtype}): {rows[-1].ms:.3f} ms/step" + cpu_words(rows[-1]))
    ratios(rows)
    return BenchResult(rows, steps, warmup, block, batch, machine(), model, config)


def main(steps: int = STEPS, warmup: int = WARMUP, block: int = BLOCK, torch: bool = True,
         cpu64: bool = True, corpus: str | None = None, json_path: str | None = None,
         model: str = "mlp") -> int:
    """`smallem bench`: print the table, and write it as JSON when asked."""
    result = run_bench(steps, warmup, block, torch=torch, cpu64=cpu64, corpus=corpus,
                       log=lambda line: print(line, flush=True), model=model)
    print(format_table(result))
    if json_path:
        from ..files import write_json

        write_json(json_path, result.to_json())
    return 0

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
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..backends import get_backend, gpu_available
from ..data import BatchSampler, SequenceSampler, load_corpus
from ..models.protocol import LanguageModel
from ..optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
from ..training import registry
from ..training.step import make_step
from .bench_isolated import ROUNDS, cpu_words, measured, time_rows
from .bench_reference import HandMlp, TorchMlp, TorchTransformer
from .calls import GPU_FUSED, NO_LAUNCH, CallCounter, step_calls  # noqa: F401 - bench's face

STEPS = 500  # timed steps per row
WARMUP = 50  # untimed steps first
BLOCK = 50  # steps between two device syncs; the median is over blocks
BENCHED = ("mlp", "transformer")  # the models with references (by hand, PyTorch) to time against


def build(model: str, backend: Any, seed: int, device: str = "gpu") -> LanguageModel:
    """Registered model `model` at the size bench times on `device` (registry.py), from `seed`:
    the same weights on every backend."""
    return registry.get(model).build(registry.get(model).bench_config(device), backend, seed)


def sequence_batches(tokens: np.ndarray, batch: int, context: int, count: int, seed: int
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """`count` batches as training draws them: inputs (B, T) and the next byte at every
    position (B, T)."""
    sampler = SequenceSampler(tokens, batch, context, seed=seed)
    return [sampler.next() for _ in range(count)]


@dataclass
class Row:
    name: str  # what ran, e.g. "smallem gpu" or "hand-written NumPy"
    device: str  # "cpu" or "gpu"
    dtype: str  # "float32" or "float64"
    ms: float  # median time per step, in milliseconds
    p10: float  # 10th and 90th percentiles of the per-block means, in ms
    p90: float
    loss: float  # the loss of the last timed step: every row should be about the same
    vs_hand: float | None = None  # ms / the hand-written step's ms (same device and dtype)
    vs_torch: float | None = None  # ms / PyTorch eager's ms (same device; on a CPU the faster with SDPA)
    vs_torch_graph: float | None = None  # ms / PyTorch's CUDA-graph step's ms (GPU)
    vs_sdpa_graph: float | None = None  # ms / PyTorch's CUDA graph with SDPA (Transformer, GPU)
    threads: int | None = None  # CPU rows: the threads the row ran on (smallem's team, torch's, BLAS's)
    faults: float | None = None  # CPU rows: minor page faults per timed step (fresh pages zeroed)


@dataclass
class BenchResult:
    rows: list[Row]
    steps: int
    warmup: int
    block: int
    batch: int
    machine: dict[str, Any] = field(default_factory=dict)
    model: str = "mlp"
    config: dict[str, Any] = field(default_factory=dict)  # the model's, per device

    def row(self, name: str) -> Row | None:
        return next((r for r in self.rows if r.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "steps": self.steps, "warmup": self.warmup,
                "block": self.block, "batch": self.batch, "config": self.config,
                "machine": self.machine, "rows": [asdict(r) for r in self.rows]}


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


def _time_row(model: str, name: str, batches: list, plan: tuple[int, int, int],
              seed: int) -> tuple[list[float], float, dict[str, Any]]:
    """In bench_isolated's child: build CPU row `name`, warm it up, time its blocks (measured)."""
    torch = name.startswith("PyTorch")  # another row's process never imports torch (seconds, threads)
    pool = transformer_candidates(torch) if model == "transformer" else candidates(torch, True)
    step, synchronize, read = next(c[3] for c in pool if c[0] == name and c[1] == "cpu")(seed)
    if name.startswith("smallem"):
        from ..backends.cpu import settle

        settle()  # this run's threads, decided now (SMALLEM_THREADS, --threads, or the machine)
    runner = Runner(step, synchronize, batches)
    warmup, steps, block = plan
    runner.run(warmup)
    info = measured(runner, lambda: [runner.timed_block(block) for _ in range(max(1, steps // block))],
                    name)
    return runner.seconds, read(runner.loss), info


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
        batches = {d: sequence_batches(data.train, batch, entry.bench_config(d).context, 16,
                                       seed) for d in {c[1] for c in pool}}
        config = {d: asdict(entry.bench_config(d)) for d in batches}
    else:
        entry = registry.get("mlp")
        batch = batch or entry.batch
        sampler = BatchSampler(data.train, batch, entry.bench_config("cpu").context, seed=seed)
        drawn = [sampler.next() for _ in range(64)]  # drawn once: sampling is not timed
        pool = [c for c in candidates(torch, cpu64) if only is None or only(c[0], c[1])]
        batches = {"gpu": drawn, "cpu": drawn}
    chosen = pool
    timed: dict[tuple[str, str], tuple] = {}  # (name, device) -> seconds, loss (, CPU's threads, faults)
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
        timed.update({(c[0], "gpu"): (r.seconds, read(r.loss), {})
                      for c, r, read in zip(gpu, runners, reads)})
    cpu = [c[0] for c in chosen if c[1] == "cpu"]
    if cpu:  # each alone in its own process: no other library's threads beside it
        plan = (warmup, steps, block)
        if model == "transformer":  # ~100x a GPU step: a tenth of the steps
            plan = (min(warmup, 3), max(1, steps // 10), max(1, block // 10))
            config["cpu_timing"] = dict(zip(("warmup", "steps", "block"), plan))
        if log is not None:
            log(f"timing {len(cpu)} implementations on the cpu: {plan_words(*plan)}, each alone in "
                f"a process of its own, in {ROUNDS} rounds")
        timed.update({(name, "cpu"): v for name, v in
                      time_rows(_time_row, model, cpu, batches["cpu"], plan, seed, log).items()})
    rows = []
    for name, device, dtype, _ in chosen:
        seconds, loss, info = timed[(name, device)]
        ms = [1e3 * t for t in seconds]
        q = np.percentile(ms, [10, 90])
        rows.append(Row(name, device, dtype, statistics.median(ms), float(q[0]), float(q[1]), loss,
                        threads=info.get("threads"), faults=info.get("faults")))
        if log is not None:
            log(f"{name} ({device}, {dtype}): {rows[-1].ms:.3f} ms/step" + cpu_words(rows[-1]))
    ratios(rows)
    return BenchResult(rows, steps, warmup, block, batch, machine(), model, config)


def ratios(rows: list[Row]) -> None:
    """Each row's time against the hand-written step and PyTorch's (same device and dtype)."""
    for r in rows:
        hand = next((h for h in rows if h.name.startswith("hand-written")
                     and (h.device, h.dtype) == (r.device, r.dtype)), None)
        # On a CPU the faster of PyTorch's eager rows (SDPA or not), as its experts would pick;
        # on a GPU plain eager, the graph rows having their own columns.
        eager = [t for t in rows if t.device == r.device and t.dtype == r.dtype and (
            t.name == "PyTorch eager" or (r.device == "cpu" and t.name == "PyTorch eager, SDPA"))]
        torch_row = min(eager, key=lambda t: t.ms) if eager else None
        graph_row = next((t for t in rows if t.name == "PyTorch CUDA graph"
                          and t.device == r.device), None)
        sdpa_row = next((t for t in rows if t.name == "PyTorch CUDA graph, SDPA"
                         and t.device == r.device), None)
        r.vs_hand = r.ms / hand.ms if hand else None
        r.vs_torch = r.ms / torch_row.ms if torch_row else None
        r.vs_torch_graph = r.ms / graph_row.ms if graph_row else None
        r.vs_sdpa_graph = r.ms / sdpa_row.ms if sdpa_row else None


def plan_words(warmup: int, steps: int, block: int) -> str:
    """A timing plan as the table says it."""
    return f"median of {max(1, steps // block)} blocks of {block} steps after {warmup} warm-up steps"


def _plan(result: BenchResult, device: str) -> tuple[int, int, int]:
    """The plan `device`'s rows ran: the Transformer's CPU rows their own (a tenth)."""
    own = result.config.get(f"{device}_timing")
    return ((own["warmup"], own["steps"], own["block"]) if own else
            (result.warmup, result.steps, result.block))


def format_table(result: BenchResult) -> str:
    transformer = result.model == "transformer"
    last = "vs SDPA graph" if transformer else "vs hand"
    head = (f"{'implementation':<26} {'device':<6} {'dtype':<8} {'ms/step':>8} {'p10-p90':>13} "
            f"{last:>8} {'vs torch':>8} {'vs graph':>8} {'loss':>8} {'threads':>7} {'faults':>7}")
    titled = "gpu" if any(r.device == "gpu" for r in result.rows) else "cpu"  # the title's rows
    context = result.config.get(titled, {}).get("context")
    what = (f"Transformer training step, batch {result.batch} x {context} bytes" if transformer
            else f"MLP training step, batch {result.batch}")
    lines = [f"{what}, AdamW: {plan_words(*_plan(result, titled))}", head, "-" * len(head)]
    for r in result.rows:
        ratio = lambda x: f"{x:.2f}x" if x is not None else "-"  # noqa: E731
        first = r.vs_sdpa_graph if transformer else r.vs_hand
        lines.append(f"{r.name:<26} {r.device:<6} {r.dtype:<8} {r.ms:>8.3f} "
                     f"{f'{r.p10:.2f}-{r.p90:.2f}':>13} {ratio(first):>8} "
                     f"{ratio(r.vs_torch):>8} {ratio(r.vs_torch_graph):>8} {r.loss:>8.4f} "
                     f"{r.threads or '-':>7} {'-' if r.faults is None else f'{r.faults:,.0f}':>7}")
    if any(r.device == "cpu" for r in result.rows):
        lines.append("threads: a CPU row's (smallem's team: SMALLEM_THREADS, --threads, or the cores "
                     "not busy); faults: minor page faults per timed step")
    lines.append("dtype: float32 = float32 products (TF32 off); tf32, bf16 = that format's matrix "
                 "inputs, float32 sums, weights and AdamW (smallem's own: smallem bench --precision)")
    if transformer and "cpu" in result.config:
        sizes = ", ".join(f"{k} {v}" for k, v in result.config["cpu"].items())
        lines.append(f"cpu rows: the smaller model ({sizes}), {plan_words(*_plan(result, 'cpu'))}")
    cpu = result.row("smallem cpu")
    for name in ("smallem gpu", "smallem gpu, captured"):
        gpu = result.row(name)
        if gpu and cpu:
            lines.append(f"smallem cpu / {name}: {cpu.ms / gpu.ms:.1f}x")
    m = result.machine
    lines.append(f"machine: {m.get('cpu_count')} CPUs" + (f", {m['gpu']}" if "gpu" in m else "")
                 + f"; numpy {m.get('numpy')}" + (f", cupy {m['cupy']}" if "cupy" in m else "")
                 + (f", torch {m['torch']}" if "torch" in m else ""))
    return "\n".join(lines)


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

"""`smallem bench`'s rows and table: what one row measured, each row's ratios to the references
in the same run, and the table as it is printed (bench.py times the rows; this says what they
mean side by side)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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
                 + (f", torch {m['torch']}" if "torch" in m else "")
                 + (f"; BLAS: {m['blas']}" if m.get("blas") else "")
                 + (f"; CPU kernels: {m['cpu kernels']}" if m.get("cpu kernels") else ""))
    return "\n".join(lines)

"""`smallem bench --precision fp32,tf32,bf16 [--sizes]`: smallem's captured step in each
precision against PyTorch's in the same precision, one process, on the GPU.

PyTorch runs as an expert runs a small model: CUDA graph, fused capturable AdamW, SDPA for the
Transformer, q/k/v in one GEMM; "fp32" with TF32 off (its default for matmul), "tf32" with
allow_tf32, "bf16" under autocast with float32 weights. fp16 is smallem's alone, captured with its
loss scaler on the device (training/scaled.py). `--sizes` times the Transformer
at the default size and at 2 × 512, 8 × 128, 8 × 512 (T 256), with TFLOP/s and the share of the
format's peak (precision.FORMATS, the H200's datasheet rates).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..backends import get_backend
from ..backends.precision import FORMATS, LossScaler, get_format
from ..data import BatchSampler, SequenceSampler, load_corpus
from ..models.transformer import TransformerConfig
from ..optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
from ..training import registry
from ..training.step import make_step
from .bench import Runner, machine, time_all
from .bench_reference import TorchMlp, TorchTransformer

SIZES = {"default": TransformerConfig(),
         "2x512": TransformerConfig(layers=2, width=512, heads=8, context=256),
         "8x128": TransformerConfig(layers=8, width=128, heads=4, context=256),
         "8x512": TransformerConfig(layers=8, width=512, heads=8, context=256)}


@dataclass
class PrecisionRow:
    model: str
    size: str
    precision: str
    smallem_ms: float
    torch_ms: float | None  # PyTorch in the same precision (None: fp16, or no PyTorch)
    tflops: float  # smallem's matrix-product FLOPs per step over its time
    peak_share: float  # tflops over the format's peak
    smallem_loss: float
    torch_loss: float | None

    @property
    def ratio(self) -> float | None:
        return self.smallem_ms / self.torch_ms if self.torch_ms else None


def step_flops(model: str, config: Any, batch: int) -> float:
    """The matrix products' FLOPs of one training step (forward, and backward twice that).
    Attention's two products are counted over the whole (T, T), as smallem computes them."""
    if model == "mlp":
        inputs = config.context * config.embed
        return 3 * 2 * batch * (inputs * config.hidden + config.hidden * config.vocab)
    b, t, c = batch, config.context, config.width
    per_layer = 2 * b * t * 12 * c * c + 4 * b * t * t * c
    return 3 * (config.layers * per_layer + 2 * b * t * c * config.vocab)


def _smallem(model: str, config: Any, precision: str, seed: int) -> tuple:
    backend = get_backend("gpu", precision)
    net = registry.get(model).build(config, backend, seed)
    scaler = LossScaler() if precision == "fp16" else None
    step = make_step(backend, net, AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY),
                     capture=True, scaler=scaler)
    return step, backend.synchronize, backend.item


def _torch(model: str, config: Any, precision: str, seed: int) -> tuple:
    kw = {"lr": ADAMW_LR, "weight_decay": ADAMW_WEIGHT_DECAY, "graph": True, "precision": precision}
    if model == "mlp":
        net: Any = TorchMlp("cuda", config, seed, **kw)
    else:
        net = TorchTransformer(registry.get(model).build(config, "cpu64", seed), "cuda", sdpa=True, **kw)
    return net.step, net.synchronize, lambda loss: float(loss.item())


def _batches(model: str, config: Any, batch: int, tokens: np.ndarray, seed: int) -> list:
    kind = BatchSampler if model == "mlp" else SequenceSampler
    sampler = kind(tokens, batch, config.context, seed=seed)
    return [sampler.next() for _ in range(16)]


def _torch_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def compare(model: str, size: str, config: Any, precisions: list[str], batch: int, tokens: np.ndarray,
            plan: tuple[int, int, int], seed: int = 0, log: Any = None) -> list[PrecisionRow]:
    """One size of one model: smallem and PyTorch in each precision, timed in turn."""
    torch = _torch_available()
    batches = _batches(model, config, batch, tokens, seed)
    runners, names = [], []
    for p in precisions:
        impls = [("smallem", _smallem)] + ([("torch", _torch)] if torch and p != "fp16" else [])
        for who, factory in impls:
            step, sync, read = factory(model, config, p, seed)
            runners.append((Runner(step, sync, batches), read))
            names.append((who, p))
    time_all([r for r, _ in runners], *plan)
    ms = {key: 1e3 * float(np.median(r.seconds)) for key, (r, _) in zip(names, runners)}
    loss = {key: read(r.loss) for key, (r, read) in zip(names, runners)}
    flops = step_flops(model, config, batch)
    rows = []
    for p in precisions:
        tflops = flops / (ms["smallem", p] * 1e-3) / 1e12
        rows.append(PrecisionRow(model, size, p, ms["smallem", p], ms.get(("torch", p)), tflops,
                                 tflops / FORMATS[p].peak_tflops, loss["smallem", p],
                                 loss.get(("torch", p))))
        if log is not None:
            log(format_row(rows[-1]))
    return rows


def format_row(r: PrecisionRow) -> str:
    torch = f"{r.torch_ms:9.3f}" if r.torch_ms else f"{'-':>9}"
    ratio = f"{r.ratio:6.2f}x" if r.ratio else f"{'-':>7}"
    return (f"{r.model:<12} {r.size:<8} {r.precision:<5} {r.smallem_ms:9.3f} {torch} {ratio} "
            f"{r.tflops:8.1f} {r.peak_share:7.1%} {r.smallem_loss:8.4f}")


HEAD = (f"{'model':<12} {'size':<8} {'prec':<5} {'smallem':>9} {'PyTorch':>9} {'ratio':>7} "
        f"{'TFLOP/s':>8} {'of peak':>7} {'loss':>8}")


def run(precisions: list[str], sizes: bool = False, corpus: str | None = None, seed: int = 0,
        log: Any = print) -> dict[str, Any]:
    """The rows: MLP and Transformer at their defaults, then (with `sizes`) the size grid."""
    for p in precisions:
        get_format(p)
    tokens = load_corpus(corpus).train
    if log is not None:
        log("ms per step, median of blocks (smallem captured; PyTorch CUDA graph, fused AdamW, "
            "SDPA, the same precision); fp32 = TF32 off")
        log(HEAD)
    rows = []
    for model in ("mlp", "transformer"):
        entry = registry.get(model)
        rows += compare(model, "default", entry.bench_config("gpu"), precisions, entry.batch, tokens,
                        (50, 500, 50), seed, log)
    if sizes:
        for size, config in SIZES.items():
            if size != "default":
                rows += compare("transformer", size, config, precisions, 64, tokens, (5, 40, 10),
                                seed, log)
    return {"machine": machine(), "peaks_tflops": {p: f.peak_tflops for p, f in FORMATS.items()},
            "rows": [asdict(r) | {"ratio": r.ratio} for r in rows]}


def main(precisions: list[str], sizes: bool = False, corpus: str | None = None,
         json_path: str | None = None) -> int:
    from ..backends import gpu_available

    if not gpu_available():
        print("smallem bench --precision compares GPU steps: no CUDA device visible to CuPy here")
        return 1
    result = run(precisions, sizes, corpus)
    if json_path:
        from ..training.paths import write_json

        write_json(json_path, result)
    return 0

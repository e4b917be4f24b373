"""The tensor-core attention kernels timed apart (round 7, issue 37): round 7's (attention_mma.py;
round 6's attention_tc.py beside it until round 9 deleted it) under several (warps, walked rows)
configurations, forward and backward split, each configuration first checked against float64,
PyTorch's bf16 SDPA (cuDNN, flash) beside them. `python benchmarks/attention_mma_variants.py
[json]` on a GPU; B·T = 32,768, 8 heads, causal, device events, median of REPS calls (eager: the
launch gaps are included).
Round 7's call 1 ran it against 4-warp defaults (results/round7/attention_call1_variants.log);
the 8-warp variants it found faster are CONFIG's defaults since.
"""

import json
import sys

import attention_variants  # benchmarks/, this script's folder: its event timer
import cupy
import numpy as np

from smallem.autodiff.attention import Attention
from smallem.backends import get_backend
from smallem.backends.cuda import attention, attention_mma

TOKENS, HEADS, REPS = 32_768, 8, 10
SHAPES = [(1024, 64), (4096, 64), (1024, 32), (4096, 32), (1024, 128), (4096, 128)]
BASE = {kind: dict(w) for kind, w in attention_mma.CONFIG.items()}
# name -> {kind: {width: CONFIG's tuple}}: changes from CONFIG (with dQ by atomics)
VARIANTS = {"fwd mt2": {"forward": {32: (4, 64, 2, 0), 64: (4, 64, 2, 0)}},
            "fwd w8": {"forward": {64: (8, 64, 1, 0), 128: (8, 64, 1, 0)}},
            "bwd w8": {"key": {64: (8, 64, 0, 0), 128: (8, 32, 0, 0)}},
            "bwd n32": {"key": {64: (4, 32, 0, 0)}}}  # (round 11: dQ by its own pass removed)


def timed(fn) -> float:
    return attention_variants.timed(fn, REPS)


def reference(q, k, v, g, causal):
    d = q.shape[-1]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(d)
    if causal:
        s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = p @ v
    ds = p * (g @ v.swapaxes(-1, -2) - (g * o).sum(-1, keepdims=True)) / np.sqrt(d)
    return o, ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ g


def errors(d: int, t: int = 300, s: int = 300, causal: bool = True) -> list[float]:
    """‖got − float64‖ / ‖float64‖ of O, dQ, dK, dV, bf16, B 2, H 2."""
    be = get_backend("gpu", "bf16")
    rng = np.random.default_rng(t + d)
    xs = [rng.normal(size=(2, 2, n, d)) for n in (t, s, s, t)]
    q, k, v, g = (cupy.asarray(x, dtype=np.float32) for x in xs)
    op = Attention(causal=causal)
    out = attention.attention_forward(be, q, k, v, op)
    grads = attention.attention_rule(be, g, out, q, k, v, op)
    got = [cupy.asnumpy(x) for x in (out, *grads)]
    return [float(np.linalg.norm(a - r) / np.linalg.norm(r)) for a, r in zip(got, reference(*xs, causal))]


def split(t: int, d: int) -> tuple[float, float]:
    be = get_backend("gpu", "bf16")
    rng = np.random.default_rng(0)
    q, k, v, g = (cupy.asarray(rng.normal(size=(TOKENS // t, HEADS, t, d)), dtype=np.float32)
                  for _ in range(4))
    op = Attention(causal=True)
    out = attention.attention_forward(be, q, k, v, op)
    fwd = timed(lambda: attention.attention_forward(be, q, k, v, op))
    bwd = timed(lambda: attention.attention_rule(be, g, out, q, k, v, op))
    return fwd, bwd


def torch_split(t: int, d: int, backend: str) -> tuple[float, float]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    choice = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    q, k, v, g = (torch.randn(TOKENS // t, HEADS, t, d, device="cuda", dtype=torch.bfloat16)
                  for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)
    with sdpa_kernel([choice]):
        def fwd():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = fwd()
        f = timed(fwd)
        both = timed(lambda: torch.autograd.grad(fwd(), (q, k, v), g))
    del y
    return f, both - f


def flops(t: int, d: int) -> float:
    return 3.5 * 4 * (TOKENS // t) * HEADS * t * t * d / 2


def row(name: str, t: int, d: int, fwd: float, bwd: float, err=None) -> dict:
    r = {"impl": name, "T": t, "D": d, "forward_ms": fwd, "backward_ms": bwd, "ms": fwd + bwd,
         "tflops": flops(t, d) / (fwd + bwd) / 1e9, "errors": err}
    print(f"{name:24s} T={t:5d} D={d:4d} fwd {fwd:7.3f} bwd {bwd:7.3f} total {fwd + bwd:7.3f} ms "
          f"{r['tflops']:6.1f} TFLOP/s" + (f"  err {max(err):.2e}" if err else ""), flush=True)
    return r


def main() -> None:
    rows = []
    for t, d in SHAPES:
        for b in ("cudnn", "flash"):
            rows.append(row(f"torch {b}", t, d, *torch_split(t, d, b)))
        rows.append(row("round7 mma atomic dQ", t, d, *split(t, d), errors(d) + errors(d, 70, 130, False)))
    for name, change in VARIANTS.items():
        for kind, widths in change.items():
            attention_mma.CONFIG[kind].update(widths)
        for t, d in SHAPES:
            if d in next(iter(change.values())):
                err = errors(d) + errors(d, 70, 130, False)
                rows.append(row(f"mma {name}", t, d, *split(t, d), err))
        for kind in BASE:
            attention_mma.CONFIG[kind].update(BASE[kind])
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

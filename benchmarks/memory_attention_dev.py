"""Device round 1 of issue 29: the fused attention kernels against a float64 reference, under
capture, inside the Transformer (fused vs unfused, checkpointed), and a first timing.

Run on the GPU machine: `python3 benchmarks/memory_attention_dev.py`; prints a table last.
"""

from __future__ import annotations

import json
import os
import sys

import cupy
import numpy as np

from smallem.autodiff import Tape, attention
from smallem.autodiff.operations import softmax
from smallem.backends import get_backend
from smallem.models.transformer import Transformer, TransformerConfig
from smallem.optim import AdamW
from smallem.training.step import make_step

be = get_backend("gpu")
OUT = os.environ.get("OUT", ".")
log: dict = {"checks": [], "capture": {}, "transformer": {}, "timing": []}


def reference(q, k, v, g, causal):
    """float64 on the host, the full (T, S) matrices: O, lse, dQ, dK, dV."""
    q, k, v, g = (np.asarray(x, np.float64) for x in (q, k, v, g))
    d = q.shape[-1]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(d)
    if causal:
        s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lse = m + np.log(p.sum(-1, keepdims=True))
    p = np.exp(s - lse)
    o = p @ v
    dv = p.swapaxes(-1, -2) @ g
    dp = g @ v.swapaxes(-1, -2)
    ds = p * (dp - (g * o).sum(-1, keepdims=True)) / np.sqrt(d)
    return o, lse, ds @ k, ds.swapaxes(-1, -2) @ q, dv


def heads_view(rng, b, h, t, d):
    """(B, H, T, D) as the Transformer makes it: a transposed view of (B, T, H, D)."""
    return cupy.asarray(rng.normal(size=(b, t, h, d)).astype(np.float32)).transpose(0, 2, 1, 3)


def rel(a, ref):
    a = np.asarray(cupy.asnumpy(a), np.float64)
    return float(np.linalg.norm(a - ref) / max(np.linalg.norm(ref), 1e-30))


def check(b, h, t, s, d, causal, strided, seed):
    rng = np.random.default_rng(seed)
    if strided:
        q, k, v, g = heads_view(rng, b, h, t, d), heads_view(rng, b, h, s, d), \
            heads_view(rng, b, h, s, d), heads_view(rng, b, h, t, d)
    else:
        q, k, v, g = (cupy.asarray(rng.normal(size=(b, h, n, d)).astype(np.float32))
                      for n in (t, s, s, t))
    tape = Tape(be)
    lq, lk, lv = tape.leaf(q), tape.leaf(k), tape.leaf(v)
    y = attention(tape, lq, lk, lv, causal=causal)
    op = tape.nodes[y.index].args[0]
    grads = tape.backward(y, grad=g)
    ref = reference(cupy.asnumpy(q), cupy.asnumpy(k), cupy.asnumpy(v), cupy.asnumpy(g), causal)
    got = [y.value, op.saved[0], grads[lq], grads[lk], grads[lv]]
    errs = [rel(a, r) for a, r in zip(got, ref)]
    row = {"shape": [b, h, t, s, d], "causal": causal, "strided": strided,
           "errors": dict(zip(("O", "lse", "dQ", "dK", "dV"), errs)),
           "finite": bool(all(np.isfinite(cupy.asnumpy(a)).all() for a in got))}
    log["checks"].append(row)
    return max(errs), row["finite"]


def fused_used():
    """Did the kernels run (not the tiled reference)? The rule's output layout says so."""
    rng = np.random.default_rng(0)
    q = heads_view(rng, 1, 2, 64, 32)
    tape = Tape(be)
    y = attention(tape, tape.leaf(q), tape.leaf(q), tape.leaf(q))
    return not y.value.flags.c_contiguous  # the kernel writes (B, T, H, D) and gives a view


def capture_check():
    rng = np.random.default_rng(5)
    shape = (2, 4, 128, 32)
    bufs = [heads_view(rng, 2, 4, 128, 32) for _ in range(4)]
    be.synchronize()
    stream = cupy.cuda.Stream()
    outs = {}
    with be.capture(stream) as graph:
        tape = Tape(be)
        leaves = [tape.leaf(x) for x in bufs[:3]]
        y = attention(tape, *leaves, causal=True)
        grads = tape.backward(y, grad=bufs[3])
        outs = [y.value] + [grads[x] for x in leaves]
    for x in bufs:  # new inputs, same buffers
        x[...] = cupy.asarray(rng.normal(size=x.shape).astype(np.float32))
    graph[0].launch(stream=stream)
    stream.synchronize()
    ref = reference(*(cupy.asnumpy(x) for x in bufs), True)
    errs = [rel(a, r) for a, r in zip(outs, (ref[0], ref[2], ref[3], ref[4]))]
    log["capture"] = {"shape": list(shape), "errors": errs}
    return max(errs)


def transformer_check():
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 257, (8, 64)), rng.integers(0, 257, (8, 64))
    res = {}
    for name, kw in (("unfused", dict(attention="unfused")), ("fused", dict(attention="auto")),
                     ("fused+ckpt", dict(attention="auto", checkpoint_blocks=True))):
        model = Transformer(TransformerConfig(**kw), be, seed=0)
        tape = Tape(be)
        loss = model.loss(tape, x, y)
        g = tape.backward(loss)
        res[name] = (float(be.item(tape.value(loss))),
                     [cupy.asnumpy(p.grad(g)) for p in model.parameters()], tape.memory())
    base = res["unfused"]
    for name, (loss, grads, mem) in res.items():
        worst = max(float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))
                    for a, b in zip(grads, base[1]))
        log["transformer"][name] = {"loss": loss, "grad_err_vs_unfused": worst, "kept": mem.kept,
                                    "peak": mem.peak, "by_op": mem.by_op}
    # a captured training step with fused attention and checkpointed blocks
    model = Transformer(TransformerConfig(attention="auto", checkpoint_blocks=True), be, seed=0)
    plain = Transformer(TransformerConfig(attention="auto", checkpoint_blocks=True), be, seed=0)
    step = make_step(be, model, AdamW(lr=1e-3))
    pstep = make_step(be, plain, AdamW(lr=1e-3), capture=False)
    la, lb = [], []
    for i in range(6):
        xb, yb = rng.integers(0, 257, (8, 64)), rng.integers(0, 257, (8, 64))
        la.append(float(be.item(step(xb, yb))))
        lb.append(float(be.item(pstep(xb, yb))))
    log["transformer"]["captured"] = {"captured": la, "plain": lb, "graph": step.graph is not None,
                                      "failed": step.failed}
    return max(abs(a - b) for a, b in zip(la, lb)), step.graph is not None


def timed(fn, reps=10):
    for _ in range(3):
        fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def timing(tokens=16384, heads=4):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for d in (32, 64):
        for t in (256, 1024, 4096):
            b = tokens // t
            rng = np.random.default_rng(t)
            q, k, v, g = (heads_view(rng, b, heads, t, d) for _ in range(4))
            row = {"T": t, "D": d, "B": b, "H": heads}

            def fused():
                tape = Tape(be)
                leaves = [tape.leaf(x) for x in (q, k, v)]
                tape.backward(attention(tape, *leaves), grad=g)

            def unfused():
                tape = Tape(be)
                lq, lk, lv = (tape.leaf(x) for x in (q, k, v))
                s = tape.mul(lq @ tape.transpose(lk, -2, -1), float(1 / np.sqrt(d)))
                tape.backward(softmax(tape, s, causal=True) @ lv, grad=g)

            for name, fn in (("fused", fused), ("unfused", unfused)):
                pool = cupy.get_default_memory_pool()
                pool.free_all_blocks()
                try:
                    row[name + "_ms"] = timed(fn)
                except Exception as e:  # out of memory, say
                    row[name + "_ms"] = f"{type(e).__name__}: {str(e)[:80]}"
            tq, tk, tv, tg = (torch.randn(b, t, heads, d, device="cuda").transpose(1, 2)
                              .requires_grad_(True) for _ in range(4))
            for name, backend, dtype in (("sdpa_eff_fp32", SDPBackend.EFFICIENT_ATTENTION, torch.float32),
                                         ("sdpa_flash_bf16", SDPBackend.FLASH_ATTENTION, torch.bfloat16)):
                xq, xk, xv = (x.detach().to(dtype).requires_grad_(True) for x in (tq, tk, tv))
                xg = tg.detach().to(dtype)

                def sdpa():
                    with sdpa_kernel(backend):
                        out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)
                    out.backward(xg)
                try:
                    for _ in range(3):
                        sdpa()
                    torch.cuda.synchronize()
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    ts = []
                    for _ in range(10):
                        e0.record()
                        sdpa()
                        e1.record()
                        e1.synchronize()
                        ts.append(e0.elapsed_time(e1))
                    row[name + "_ms"] = float(np.median(ts))
                except Exception as e:
                    row[name + "_ms"] = f"{type(e).__name__}: {str(e)[:80]}"
            log["timing"].append(row)
            print(row, flush=True)


def main():
    print("kernels used:", fused_used(), flush=True)
    worst = []
    cases = [(2, 4, 64, 64, 32, True, True), (2, 4, 100, 100, 64, True, True),
             (1, 2, 37, 37, 16, True, False), (2, 3, 50, 70, 32, False, True),
             (3, 4, 257, 257, 64, True, True), (1, 1, 1, 1, 32, True, False),
             (2, 2, 130, 130, 16, False, False), (1, 4, 1000, 1000, 64, True, True)]
    for i, c in enumerate(cases):
        e, fin = check(*c, seed=i)
        worst.append(e)
        print("check", c, f"{e:.2e}", "finite" if fin else "NOT FINITE", flush=True)
    print("capture max rel err", capture_check(), flush=True)
    print("transformer captured vs plain", transformer_check(), flush=True)
    print(json.dumps(log["transformer"], default=str)[:1500], flush=True)
    if "--no-timing" not in sys.argv:
        timing()
    with open(os.path.join(OUT, "memory_attention_dev.json"), "w") as f:
        json.dump(log, f, indent=1, default=str)
    print("worst kernel rel err", max(worst))


if __name__ == "__main__":
    main()

"""The Bengio MLP training step written by hand, without autograd: what `smallem bench` measures
smallem against.

`HandMlp` is one array-module implementation (NumPy on the CPU, CuPy on the GPU) with every
gradient derived on paper; `TorchMlp` is the same model in PyTorch (eager, or replayed as one
CUDA graph). All start from the same initial weights as smallem's Mlp (the same seeded draws),
so after the same batches every implementation should report about the same loss.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..autodiff.operations import LAYER_NORM_EPS
from ..models.mlp import MlpConfig
from ..nn import normal
from ..optim import ADAMW_BETAS, ADAMW_EPS


def initial_weights(config: MlpConfig, seed: int) -> dict[str, np.ndarray]:
    """The draws of smallem's Mlp(config, seed=seed), in its order (float64, host)."""
    c, rng = config, np.random.default_rng(seed)
    return {"embedding": normal(rng, (c.vocab, c.embed)),
            "w1": normal(rng, (c.context * c.embed, c.hidden)), "b1": np.zeros(c.hidden),
            "w2": normal(rng, (c.hidden, c.vocab)), "b2": np.zeros(c.vocab)}


DECAY = {"embedding": False, "w1": True, "b1": False, "w2": True, "b2": False}


class HandMlp:
    """One AdamW training step of the MLP in plain array code: NumPy or CuPy (`xp`)."""

    def __init__(self, xp: Any, dtype: str = "float32", config: MlpConfig | None = None,
                 seed: int = 0, lr: float = 2e-3, weight_decay: float = 0.01,
                 betas: tuple[float, float] = ADAMW_BETAS, eps: float = ADAMW_EPS) -> None:
        self.xp, self.dtype, self.config = xp, np.dtype(dtype), config or MlpConfig()
        self.p = {k: xp.asarray(v, dtype=self.dtype) for k, v in
                  initial_weights(self.config, seed).items()}
        self.m = {k: xp.zeros_like(v) for k, v in self.p.items()}
        self.v = {k: xp.zeros_like(v) for k, v in self.p.items()}
        self.lr, self.wd, (self.b1, self.b2), self.eps = lr, weight_decay, betas, eps
        self.t = 0
        self.columns = xp.arange(self.config.embed)  # for the flattened scatter-add
        self.vocab = xp.arange(self.config.vocab)

    def step(self, contexts: np.ndarray, targets: np.ndarray) -> Any:
        """Forward, backward, AdamW; returns the loss as an unread array."""
        xp, p, c = self.xp, self.p, self.config
        ctx, tgt = xp.asarray(contexts), xp.asarray(targets)
        B = ctx.shape[0]
        # forward
        flat = p["embedding"][ctx].reshape(B, c.context * c.embed)  # (B, T·C)
        h = xp.tanh(flat @ p["w1"] + p["b1"])  # (B, H)
        logits = h @ p["w2"] + p["b2"]  # (B, V)
        z = logits - logits.max(axis=1, keepdims=True)
        e = xp.exp(z)
        s = e.sum(axis=1, keepdims=True)
        loss = xp.log(s[:, 0]).mean() - xp.take_along_axis(z, tgt[:, None], axis=1).mean()
        # backward: d logits = (softmax − onehot)/B, then each layer by hand
        d_logits = e / s
        if xp is np:
            d_logits[np.arange(B), tgt] -= 1.0
        else:  # fancy-index assignment is slow in CuPy: subtract a comparison instead
            d_logits -= tgt[:, None] == self.vocab
        d_logits /= B
        g = {"w2": h.T @ d_logits, "b2": d_logits.sum(axis=0)}
        d_pre = (d_logits @ p["w2"].T) * (1.0 - h * h)  # tanh' = 1 − tanh²
        g["w1"], g["b1"] = flat.T @ d_pre, d_pre.sum(axis=0)
        d_emb = (d_pre @ p["w1"].T).reshape(-1)  # (B·T·C): one value per embedding cell read
        cells = (ctx.reshape(-1, 1) * c.embed + self.columns).reshape(-1)
        g["embedding"] = self._scatter_add(cells, d_emb, p["embedding"].size
                                           ).reshape(p["embedding"].shape)
        self._adamw(g)
        return loss

    def _scatter_add(self, cells: Any, values: Any, size: int) -> Any:
        out = self.xp.zeros(size, dtype=self.dtype)
        if self.xp is np:
            np.add.at(out, cells, values)  # unbuffered: repeated cells all count
        else:
            import cupyx

            cupyx.scatter_add(out, cells, values)  # atomic adds
        return out

    def _adamw(self, grads: dict[str, Any]) -> None:
        xp = self.xp
        self.t += 1
        bc1, bc2 = 1.0 - self.b1 ** self.t, 1.0 - self.b2 ** self.t
        for k, g in grads.items():
            p, m, v = self.p[k], self.m[k], self.v[k]
            wd = self.wd if DECAY[k] else 0.0  # decoupled decay, matrices only
            if xp is not np:  # on the GPU, what anyone would write: one fused kernel
                _cupy_adamw()(g, self.lr, self.b1, self.b2, self.eps, wd, bc1, bc2, p, m, v)
                continue
            # The same in-place passes as ArrayBackend.adamw_update, on purpose: the bench measures
            # what the tape costs, not two ways of writing AdamW (tests check the formula).
            m *= self.b1
            m += (1.0 - self.b1) * g
            v *= self.b2
            v += (1.0 - self.b2) * (g * g)
            denom = xp.sqrt(v / bc2)
            denom += self.eps
            if wd:
                p *= 1.0 - self.lr * wd
            p -= (self.lr / bc1) * m / denom

    def synchronize(self) -> None:
        if self.xp is not np:
            self.xp.cuda.get_current_stream().synchronize()


_ADAMW_KERNEL: list[Any] = []


def _cupy_adamw() -> Any:
    """p, m, v updated in one ElementwiseKernel launch per parameter."""
    if not _ADAMW_KERNEL:
        import cupy

        _ADAMW_KERNEL.append(cupy.ElementwiseKernel(
            "T g, T lr, T b1, T b2, T eps, T wd, T bc1, T bc2", "T p, T m, T v",
            """m = b1 * m + (1 - b1) * g;
               v = b2 * v + (1 - b2) * g * g;
               p -= lr * ((m / bc1) / (sqrt(v / bc2) + eps) + wd * p);""",
            "hand_adamw"))
    return _ADAMW_KERNEL[0]


def _torch_precision(precision: str) -> str:
    if precision not in ("fp32", "tf32", "bf16"):
        raise ValueError(f"the PyTorch twins run fp32, tf32 or bf16, not {precision!r}")
    return precision


class TorchMlp:
    """The same model and optimizer in PyTorch as an expert writes it: autograd and
    torch.optim.AdamW, fused into one kernel on a GPU (`fused=True`). `graph=True` captures the
    whole step once (AdamW `capturable`) and replays it as a CUDA graph. `precision` "tf32"
    turns allow_tf32 on for its products; "bf16" runs the forward under autocast (float32
    weights and optimizer, as an expert's mixed precision does); "fp32", the default, neither."""

    def __init__(self, device: str = "cpu", config: MlpConfig | None = None, seed: int = 0,
                 lr: float = 2e-3, weight_decay: float = 0.01, graph: bool = False,
                 precision: str = "fp32") -> None:
        import torch

        self.precision = _torch_precision(precision)
        self.torch, self.device, self.config = torch, torch.device(device), config or MlpConfig()
        w = initial_weights(self.config, seed)
        self.p = {k: torch.tensor(v, dtype=torch.float32, device=self.device, requires_grad=True)
                  for k, v in w.items()}
        groups = [{"params": [self.p[k] for k in w if DECAY[k]], "weight_decay": weight_decay},
                  {"params": [self.p[k] for k in w if not DECAY[k]], "weight_decay": 0.0}]
        try:  # the fused AdamW, as experts run it (on a CPU too, since torch 2.4)
            self.opt = torch.optim.AdamW(groups, lr=lr, capturable=graph, fused=True)
        except (RuntimeError, TypeError, ValueError):  # an older torch on a CPU: its default
            self.opt = torch.optim.AdamW(groups, lr=lr, capturable=graph)
        self.use_graph, self.graph = graph, None

    def _loss(self, ctx: Any, tgt: Any) -> Any:
        if self.precision == "bf16":  # what autocast does to matmuls; softmax, LN, loss float32
            with self.torch.autocast(self.device.type, dtype=self.torch.bfloat16, cache_enabled=False):
                return self._forward(ctx, tgt)
        return self._forward(ctx, tgt)

    def _forward(self, ctx: Any, tgt: Any) -> Any:
        F, p, c = self.torch.nn.functional, self.p, self.config
        flat = F.embedding(ctx, p["embedding"]).reshape(ctx.shape[0], c.context * c.embed)
        h = self.torch.tanh(flat @ p["w1"] + p["b1"])
        return F.cross_entropy(h @ p["w2"] + p["b2"], tgt)

    def _eager(self, ctx: Any, tgt: Any) -> Any:
        self.opt.zero_grad(set_to_none=True)
        loss = self._loss(ctx, tgt)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def step(self, contexts: np.ndarray, targets: np.ndarray) -> Any:
        matmul = self.torch.backends.cuda.matmul
        before, matmul.allow_tf32 = matmul.allow_tf32, self.precision == "tf32"
        try:  # TF32 on for this model's products only (a graph keeps what it captured)
            return self._step(contexts, targets)
        finally:
            matmul.allow_tf32 = before

    def _step(self, contexts: np.ndarray, targets: np.ndarray) -> Any:
        torch = self.torch
        ctx = torch.from_numpy(contexts).to(self.device, non_blocking=True)
        tgt = torch.from_numpy(targets).to(self.device, non_blocking=True)
        if not self.use_graph:
            return self._eager(ctx, tgt)
        if self.graph is None:  # warm up on a side stream, then capture one whole step
            self.ctx, self.tgt = ctx.clone(), tgt.clone()  # the graph's fixed input buffers
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self._eager(self.ctx, self.tgt)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            self.opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(self.graph):
                self.static_loss = self._loss(self.ctx, self.tgt)
                self.static_loss.backward()
                self.opt.step()
        self.ctx.copy_(ctx)
        self.tgt.copy_(tgt)
        self.graph.replay()
        return self.static_loss

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


class TorchTransformer:
    """smallem's Transformer (models/transformer.py) in PyTorch as an expert writes it, from the
    same weights: pre-LN blocks, F.linear (q, k, v as one fused GEMM, as nanoGPT's c_attn),
    F.layer_norm, tanh GELU, fused AdamW on a GPU; `precision` "tf32" (allow_tf32) or "bf16"
    (the forward under autocast, float32 weights and optimizer), "fp32" by default.
    Attention written out (q·kᵀ/√D, a causal mask, softmax, ·v) or, with `sdpa`, PyTorch's fused
    F.scaled_dot_product_attention. `graph=True` captures the whole step (capturable AdamW) and
    replays it as a CUDA graph. With `dtype=torch.float64` it is the twin the gradient tests
    compare smallem's tape with (`gradients`, `weights`: in smallem's layout and names)."""

    def __init__(self, model: Any, device: str = "cpu", lr: float = 1e-3,
                 weight_decay: float = 0.01, graph: bool = False, sdpa: bool = False,
                 dtype: Any = None, precision: str = "fp32") -> None:
        import torch

        self.torch, self.device, self.config = torch, torch.device(device), model.config
        self.dtype = dtype or torch.float32
        self.sdpa, self.use_graph, self.graph = sdpa, graph, None
        self.precision = _torch_precision(precision)  # as TorchMlp's
        self.p: dict[str, Any] = {}
        self.names = transformer_names(model)
        tables = (self.names["tokens"], self.names["positions"])
        decay, plain = [], []
        values = {}
        for name, param in model.named_parameters():
            value = torch.tensor(param.numpy(), dtype=self.dtype, device=self.device)
            if value.ndim == 2 and name not in tables:
                value = value.t().contiguous()  # nn.Linear's (out, in), for F.linear
            values[name] = (value, param.decay)
        # q, k and v as one GEMM, as nanoGPT writes it (c_attn): one (3C, C) weight per block
        self.fused_qkv = {}
        for block in self.names["blocks"]:
            for kind in ("weight", "bias"):
                parts = [f"{block}.{self.names[p]}.{kind}" for p in ("query", "key", "value")]
                if all(n in values for n in parts):
                    fused = f"{block}.qkv.{kind}"
                    values[fused] = (torch.cat([values.pop(n)[0] for n in parts]), kind == "weight")
                    self.fused_qkv[fused] = parts
        for name, (value, decays) in values.items():
            self.p[name] = value.requires_grad_()
            (decay if decays else plain).append(self.p[name])
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": plain, "weight_decay": 0.0}]
        try:  # the fused AdamW, as experts run it (on a CPU too, since torch 2.4)
            self.opt = torch.optim.AdamW(groups, lr=lr, capturable=graph, fused=True)
        except (RuntimeError, TypeError, ValueError):  # an older torch on a CPU: its default
            self.opt = torch.optim.AdamW(groups, lr=lr, capturable=graph)
        t = self.config.context
        self.mask = torch.ones(t, t, dtype=torch.bool, device=self.device).tril()

    def _linear(self, x: Any, name: str) -> Any:
        bias = self.p.get(f"{name}.bias")
        return self.torch.nn.functional.linear(x, self.p[f"{name}.weight"], bias)

    def _layer_norm(self, x: Any, name: str) -> Any:
        w = self.p[f"{name}.weight"]
        return self.torch.nn.functional.layer_norm(x, w.shape, w, self.p[f"{name}.bias"],
                                                   self.names["eps"])

    def _attention(self, h: Any, block: str) -> Any:
        F, n = self.torch.nn.functional, self.names
        B, T, C = h.shape
        H = self.config.heads
        q, k, v = (part.view(B, T, H, C // H).transpose(1, 2)
                   for part in self._linear(h, f"{block}.qkv").split(C, dim=-1))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))
            y = F.softmax(scores, dim=-1) @ v
        return self._linear(y.transpose(1, 2).reshape(B, T, C), f"{block}.{n['out']}")

    def _forward(self, ctx: Any, tgt: Any) -> Any:
        F, n = self.torch.nn.functional, self.names
        T = ctx.shape[1]
        x = F.embedding(ctx, self.p[n["tokens"]]) + self.p[n["positions"]][:T]
        for block in n["blocks"]:
            x = x + self._attention(self._layer_norm(x, f"{block}.{n['ln1']}"), block)
            h = self._linear(self._layer_norm(x, f"{block}.{n['ln2']}"), f"{block}.{n['fc']}")
            x = x + self._linear(F.gelu(h, approximate="tanh"), f"{block}.{n['proj']}")
        logits = self._linear(self._layer_norm(x, n["ln_f"]), n["head"])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))

    def _smallem_layout(self, name: str, x: Any) -> np.ndarray:
        """A parameter-shaped tensor as smallem holds it: a Linear's weight (in, out), float64."""
        x = x.detach().cpu().double().numpy()
        tables = (self.names["tokens"], self.names["positions"])
        return x.T.copy() if x.ndim == 2 and name not in tables else x

    def gradients(self, contexts: np.ndarray, targets: np.ndarray) -> tuple[float, dict]:
        """(loss, {name: gradient}) by PyTorch's autograd, nothing updated."""
        for p in self.p.values():
            p.grad = None
        ctx, tgt = (self.torch.from_numpy(np.asarray(a)).to(self.device) for a in (contexts, targets))
        loss = self._loss(ctx, tgt)
        loss.backward()
        return float(loss.detach()), self._split({n: p.grad for n, p in self.p.items()})

    def weights(self) -> dict[str, np.ndarray]:
        return self._split(self.p)

    def _split(self, tensors: dict[str, Any]) -> dict[str, np.ndarray]:
        """Per smallem parameter name, in its layout: the fused q/k/v split back in three."""
        out = {}
        for name, x in tensors.items():
            parts = self.fused_qkv.get(name)
            for part, piece in zip(parts or [name], x.chunk(3) if parts else [x]):
                out[part] = self._smallem_layout(part, piece)
        return out

    _loss = TorchMlp._loss
    _eager = TorchMlp._eager
    step = TorchMlp.step
    _step = TorchMlp._step
    synchronize = TorchMlp.synchronize


def transformer_names(model: Any) -> dict[str, Any]:
    """Where each piece of smallem's Transformer sits among its parameter names."""
    return {"tokens": "token.weight", "positions": "position.weight",
            "blocks": [f"blocks.{i}" for i in range(model.config.layers)],
            "ln1": "attention_norm", "ln2": "mlp_norm", "query": "attention.query",
            "key": "attention.key", "value": "attention.value", "out": "attention.output",
            "fc": "mlp.expand", "proj": "mlp.contract", "ln_f": "final_norm", "head": "head",
            "eps": LAYER_NORM_EPS}

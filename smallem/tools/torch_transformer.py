"""smallem's Transformer written in PyTorch, for checking and timing it (nothing in the package
imports this; tests and `smallem bench --model transformer` do).

`TorchTransformer` takes the weights of a smallem Transformer by name (W stored (in, out), as
smallem's Linear) and computes the same function with PyTorch's autograd: the gradients of the
two must agree, and its AdamW step is what the bench times smallem's step against.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..models.transformer import TransformerConfig


class TorchTransformer:
    """The same pre-LN Transformer, functional, over a dict of torch leaves named as smallem's."""

    def __init__(self, config: TransformerConfig, weights: dict[str, np.ndarray],
                 decay: dict[str, bool] | None = None, *, dtype: Any = None, device: str = "cpu",
                 lr: float = 1e-3, weight_decay: float = 0.01) -> None:
        import torch

        self.torch, self.config = torch, config
        self.dtype = dtype or torch.float32
        self.p = {name: torch.tensor(np.asarray(w), dtype=self.dtype, device=device,
                                     requires_grad=True) for name, w in weights.items()}
        decay = decay or {}
        groups = [{"params": [p for n, p in self.p.items() if decay.get(n)],
                   "weight_decay": weight_decay},
                  {"params": [p for n, p in self.p.items() if not decay.get(n)],
                   "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
        self.device = device

    def linear(self, x: Any, name: str) -> Any:
        return x @ self.p[f"{name}.weight"] + self.p[f"{name}.bias"]

    def norm(self, x: Any, name: str) -> Any:
        return self.torch.nn.functional.layer_norm(
            x, (x.shape[-1],), self.p[f"{name}.weight"], self.p[f"{name}.bias"], 1e-5)

    def logits(self, inputs: np.ndarray) -> Any:
        torch, F, c = self.torch, self.torch.nn.functional, self.config
        idx = torch.as_tensor(np.asarray(inputs), device=self.device)
        b, t = idx.shape
        h, d = c.heads, c.width // c.heads
        x = self.p["token.weight"][idx] + self.p["position.weight"][:t]  # (B, T, C)
        masked = torch.triu(torch.ones(t, t, dtype=torch.bool, device=self.device), 1)
        for k in range(c.layers):
            pre = f"blocks.{k}"
            y = self.norm(x, f"{pre}.attention_norm")
            q, kk, v = (self.linear(y, f"{pre}.attention.{n}").view(b, t, h, d).transpose(1, 2)
                        for n in ("query", "key", "value"))  # (B, H, T, D)
            scores = (q @ kk.transpose(-2, -1)) / math.sqrt(d)  # (B, H, T, T)
            weights = scores.masked_fill(masked, float("-inf")).softmax(-1)
            merged = (weights @ v).transpose(1, 2).reshape(b, t, c.width)  # (B, T, C)
            x = x + self.linear(merged, f"{pre}.attention.output")
            y = self.norm(x, f"{pre}.mlp_norm")
            hidden = F.gelu(self.linear(y, f"{pre}.mlp.expand"), approximate="tanh")
            x = x + self.linear(hidden, f"{pre}.mlp.contract")
        return self.linear(self.norm(x, "final_norm"), "head")  # (B, T, V)

    def loss(self, inputs: np.ndarray, targets: np.ndarray) -> Any:
        """Mean cross-entropy over every position (targets (B, T))."""
        logits = self.logits(inputs)
        y = self.torch.as_tensor(np.asarray(targets), device=self.device)
        return self.torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                      y.reshape(-1))

    def gradients(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[float, dict]:
        """(loss, {name: gradient as float64 NumPy})."""
        for p in self.p.values():
            p.grad = None
        loss = self.loss(inputs, targets)
        loss.backward()
        return float(loss.detach()), {n: p.grad.detach().cpu().double().numpy() for n, p in self.p.items()}

    def step(self, inputs: np.ndarray, targets: np.ndarray) -> Any:
        """One AdamW training step; the loss comes back unread."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(inputs, targets)
        loss.backward()
        self.optimizer.step()
        return loss.detach()


def from_model(model: Any, **kw: Any) -> TorchTransformer:
    """The PyTorch twin of a smallem Transformer, on its current weights."""
    named = model.named_parameters()
    return TorchTransformer(model.config, {n: p.numpy() for n, p in named},
                            {n: p.decay for n, p in named}, **kw)

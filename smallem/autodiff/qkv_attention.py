"""A self-attention's three projections and its attention as one operation (the GPU's packed path).

The Transformer makes q, k, v with three Linears and hands them to `attention` (attention.py).
Where a backend fuses this operation (backends/cuda/qkv.py) the three products are one product
with the weights side by side (C, 3C), and its rule one product for dx and one for the weights,
where three Linear nodes took three each and two adds to sum dx. The parameters stay three
Linears' (names, checkpoints, the CPU's path): this is a way of computing, not a new layer.
"""

from __future__ import annotations

from typing import Any

from ..backends import Backend, Tensor
from ..errors import SmallemError
from .attention import Attention
from .operations import Operation, register
from .primitives import RULES


@register
class QkvAttention(Operation):
    """O = attention(x·Wq + bq, x·Wk + bk, x·Wv + bv) with the projections split into H heads.
    Inputs: x [B, T, C], then weight [C, C] and bias [C] of q, k and v. Output (B, H, T, D) as
    attention's; the attention is `self.attention` (causal, 1/√D)."""

    name = "qkv_attention"

    def __init__(self, heads: int, causal: bool = True) -> None:
        self.heads = int(heads)
        # O's 16-bit copy for the output Linear, written by the GPU's tensor-core forward; none of
        # dq, dk, dv: the rule joins them into dP and writes dP's copy (backends/cuda/qkv.py)
        self.attention = Attention(causal, copies=True)
        self.attention.grad_copies = False
        self.kept: tuple[Tensor, ...] = ()  # q, k, v (the fused forward: them packed, (B, T, 3C))

    @property
    def saved(self) -> tuple[Tensor, ...]:
        """What the node keeps beside its output (tape.memory counts it): q, k, v and the lse."""
        return self.kept + self.attention.saved

    def check(self, *shapes: tuple[int, ...]) -> None:
        x, *params = shapes
        c = x[-1] if len(x) == 3 else None
        if (c is None or c % self.heads or len(params) != 6
                or any(tuple(p) != ((c, c) if i % 2 == 0 else (c,)) for i, p in enumerate(params))):
            raise SmallemError(f"qkv_attention: input {list(x)} needs (B, T, C) with C a multiple of "
                               f"{self.heads} heads, and weight [C, C], bias [C] for each of q, k "
                               f"and v; got {[list(p) for p in params]}")

    def projections(self, be: Backend, x: Tensor, *params: Tensor) -> list[Tensor]:
        """q, k, v (B, H, T, D): each x·W + b, its C channels split into H heads of D."""
        b, t, c = be.shape(x)
        out = []
        for w, bias in zip(params[0::2], params[1::2]):
            y = be.add(be.matmul(x, w), bias)  # (B, T, C), what a Linear node computes
            out.append(be.transpose(be.reshape(y, (b, t, self.heads, c // self.heads)), 1, 2))
        return out

    def forward(self, be: Backend, x: Tensor, *params: Tensor) -> Tensor:
        self.kept = tuple(self.projections(be, x, *params))  # as the three Linear nodes kept them
        return self.attention.forward(be, *self.kept)

    def backward(self, be: Backend, grad: Tensor, out: Tensor, x: Tensor, *params: Tensor) -> tuple:
        """dq, dk, dv from attention's rule; then each Linear's: dx = Σ d·Wᵀ, dW = Σ xᵀ·d, db = Σ d"""
        b, t, c = be.shape(x)
        qkv = self.kept if len(self.kept) == 3 else self.projections(be, x, *params)
        dqkv = self.attention.backward(be, grad, out, *qkv)
        dx, grads = None, []
        # v, k, q: the order the tape's walk reaches the three Linears in, so dx's sum is theirs
        for d, w in reversed(list(zip(dqkv, params[0::2]))):
            d = be.reshape(be.transpose(d, 1, 2), (b, t, c))  # heads merged back: (B, T, C)
            part, dw = RULES["matmul"](be, d, None, x, w)
            dx = part if dx is None else be.add(dx, part)
            grads = [dw, d] + grads  # the tape sums db over the rows, as for a bias add
        return (dx, *grads)


def qkv_attention(tape: Any, x: Any, wq: Any, bq: Any, wk: Any, bk: Any, wv: Any, bv: Any,
                  heads: int, causal: bool = True) -> Any:
    """attention(x·Wq + bq, x·Wk + bk, x·Wv + bv) over `heads` heads as one node (B, H, T, D)."""
    return tape.apply(QkvAttention(heads, causal), [x, wq, bq, wk, bk, wv, bv])

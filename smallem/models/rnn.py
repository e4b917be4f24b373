"""A vanilla recurrent network unrolled on the tape: h_t = φ(x_t W_xh + h_{t−1} W_hh + b).

A Module of nn.py (its Parameters bind one leaf per tape, optimizers update them in place).
The same W_hh is used at every step, so backward multiplies the gradient by W_hhᵀ (and by φ')
once per step: notebook 08 shows that W_hh's largest |eigenvalue| decides whether the gradient
reaching early states vanishes (< 1) or explodes (> 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..autodiff.tape import Tape, Var
from ..backends import DEFAULT_BACKEND, Backend, get_backend
from ..errors import SmallemError
from ..nn import Module, Parameter
from ..optim import gradient_norms

NONLINEARITIES = ("tanh", "linear")  # "linear" makes the eigenvalue story exact


def scaled_orthogonal(size: int, radius: float, rng: np.random.Generator) -> np.ndarray:
    """A random orthogonal matrix times `radius`: every eigenvalue has |λ| = radius and every
    singular value is radius, so a linear RNN scales the gradient by exactly radius per step."""
    q, r = np.linalg.qr(rng.normal(size=(size, size)))
    return radius * q * np.sign(np.diag(r))  # the sign fix makes q uniformly distributed


def spectral_radius(matrix: Any) -> float:
    """The largest |eigenvalue| of a square matrix (an array or a Parameter)."""
    if isinstance(matrix, Parameter):
        matrix = matrix.numpy()
    return float(np.max(np.abs(np.linalg.eigvals(np.asarray(matrix, dtype=np.float64)))))


def with_spectral_radius(matrix: np.ndarray, radius: float) -> np.ndarray:
    """`matrix` rescaled so that its largest |eigenvalue| is `radius`."""
    return matrix * (radius / spectral_radius(matrix))


def _check_nonlinearity(nonlinearity: str) -> None:
    if nonlinearity not in NONLINEARITIES:
        raise SmallemError(f"rnn: unknown nonlinearity {nonlinearity!r}; choose one of "
                           f"{', '.join(NONLINEARITIES)}")


def unroll(tape: Tape, xs: Any, w_xh: Var, w_hh: Var, bias: Var | None = None,
           h0: Var | None = None, nonlinearity: str = "tanh") -> list[Var]:
    """Run the recurrence over xs (B, T, C), data held as constants; return [h_0, ..., h_T],
    each (B, H). h_0 defaults to zeros (a constant); pass a leaf to get its gradient."""
    _check_nonlinearity(nonlinearity)
    xs = np.asarray(tape.backend.to_numpy(xs.value) if isinstance(xs, Var) else xs)
    if xs.ndim != 3 or xs.shape[2] != w_xh.shape[0]:
        raise SmallemError(f"rnn: inputs must be [batch, time, {w_xh.shape[0]}] (B, T, C), "
                           f"got {list(xs.shape)}")
    batch, steps, _ = xs.shape
    h = tape.constant(np.zeros((batch, w_hh.shape[0]))) if h0 is None else h0
    states = [h]
    for t in range(steps):
        pre = tape.constant(xs[:, t, :]) @ w_xh + h @ w_hh  # (B, H)
        if bias is not None:
            pre = pre + bias
        h = tape.tanh(pre) if nonlinearity == "tanh" else pre
        states.append(h)
    return states


@dataclass
class RNNRun:
    """What one forward pass leaves on the tape: every hidden state and the readout."""

    hidden: list[Var]  # [h_0, ..., h_T], each (B, H)
    output: Var  # h_T W_hy + b_y, (B, O)


class RNN(Module):
    """A vanilla RNN with a linear readout of its last state, y = h_T W_hy + b_y.
    Parameters: w_xh (C, H), w_hh (H, H), b (H), w_hy (H, O), b_y (O)."""

    def __init__(self, input_size: int, hidden_size: int, output_size: int = 1, *,
                 radius: float = 0.9, nonlinearity: str = "tanh", orthogonal: bool = True,
                 backend: Backend | str = DEFAULT_BACKEND, seed: int = 0) -> None:
        """W_hh gets largest |eigenvalue| `radius`: a scaled orthogonal matrix (every |λ| equal)
        or, with orthogonal=False, a Gaussian matrix rescaled to that radius. float64 by
        default: the lesson asserts gradient ratios to ten digits."""
        _check_nonlinearity(nonlinearity)
        self.nonlinearity = nonlinearity
        self.backend = get_backend(backend)
        rng = np.random.default_rng(seed)
        w_hh = (scaled_orthogonal(hidden_size, radius, rng) if orthogonal else
                with_spectral_radius(rng.normal(size=(hidden_size, hidden_size)), radius))
        # Xavier-scaled input and readout: only W_hh carries the story.
        self.w_xh = Parameter(rng.normal(size=(input_size, hidden_size)) / np.sqrt(input_size),
                              backend, decay=True)
        self.w_hh = Parameter(w_hh, backend, decay=True)
        self.b = Parameter(np.zeros(hidden_size), backend)
        self.w_hy = Parameter(rng.normal(size=(hidden_size, output_size)) / np.sqrt(hidden_size),
                              backend, decay=True)
        self.b_y = Parameter(np.zeros(output_size), backend)

    def forward(self, tape: Tape, xs: Any, h0: Var | None = None) -> RNNRun:
        """Unroll over xs (B, T, C) and read out the last state: (B, O)."""
        hidden = unroll(tape, xs, self.w_xh.var(tape), self.w_hh.var(tape), self.b.var(tape),
                        h0, self.nonlinearity)
        return RNNRun(hidden, hidden[-1] @ self.w_hy.var(tape) + self.b_y.var(tape))

    __call__ = forward


def hidden_gradient_norms(model: RNN, xs: Any, *, seed: int = 0) -> np.ndarray:
    """‖d loss / d h_t‖ for t = 0..T, for a loss that reads only the last state
    (loss = Σ h_T · r, r random): how much of the last step's error reaches each earlier state."""
    tape = Tape(model.backend)
    batch, hidden = np.shape(xs)[0], model.w_hh.shape[0]
    h0 = tape.leaf(np.zeros((batch, hidden)))  # a leaf, so that it too receives a gradient
    run = model.forward(tape, xs, h0)
    r = np.random.default_rng(seed).normal(size=(batch, hidden))
    grads = tape.backward(tape.sum(run.hidden[-1] * tape.constant(r)))
    return np.array(gradient_norms(grads, run.hidden))

"""Diagnostics: numbers that say why training fails, measured on real tensors.

Sits beside the tape, below training code and notebooks: it reads activations and gradients
through the Backend protocol only, so it works the same on NumPy and CuPy. Notebook 08 (the
leaky abstraction) uses it for dead ReLUs, gradient norms and clipping; other lessons reuse it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..autodiff.tape import Gradients, Var
from ..backends import Backend, Tensor, get_backend
from ..errors import SmallemError, require


def _tensor(x: Tensor | Var) -> Tensor:
    return x.value if isinstance(x, Var) else x


def norm(backend: Backend | str, x: Tensor | Var) -> float:
    """The Euclidean (Frobenius) norm of one tensor, as a Python float."""
    return global_norm(backend, [_tensor(x)])


def gradient_norms(grads: Gradients, variables: Sequence[Var]) -> list[float]:
    """‖d loss / d v‖ for each Var `v`, in order: per layer, per time step, per parameter."""
    if not variables:
        return []
    backend = variables[0].tape.backend
    return [norm(backend, grads[v]) for v in variables]


def dead_units(backend: Backend | str, activations: Sequence[Tensor | Var]) -> list[np.ndarray]:
    """For each layer's activations [..., H] over a whole data set, a boolean mask [H] of the
    units that output zero (or less) for every input: their ReLU passes no gradient, ever."""
    be = get_backend(backend)
    masks = []
    for k, a in enumerate(activations):
        a = _tensor(a)
        shape = be.shape(a)
        if len(shape) < 2:
            raise SmallemError(f"dead_units: layer {k} has shape {list(shape)}; pass the "
                               "activations of a data set, [inputs, units] (or [..., units])")
        rows = be.reshape(a, (-1, shape[-1]))  # every input, every position: one row each
        alive_count = be.sum(be.positive(rows), 0)  # inputs on which each unit is active, [H]
        masks.append(np.asarray(be.to_numpy(alive_count)) == 0)
    return masks


def dead_fraction(backend: Backend | str, activations: Sequence[Tensor | Var]) -> list[float]:
    """The fraction of dead units per layer (see `dead_units`), one float per layer."""
    return [float(mask.mean()) for mask in dead_units(backend, activations)]


def global_norm(backend: Backend | str, tensors: Sequence[Tensor | None]) -> float:
    """√(Σ ‖g‖²) over every tensor of the list, as if they were one long vector (None skipped).

    Each tensor is divided by its largest |element| before squaring, and the parts are added
    on the host in float64: a float32 gradient of norm 1e20, exactly the kind clipping exists
    for, would otherwise square to inf."""
    be = get_backend(backend)
    total = 0.0
    for g in tensors:
        if g is None:
            continue
        flat = be.reshape(g, (-1,))
        if be.shape(flat)[0] == 0:
            continue
        peak = be.item(be.max(be.abs(flat), 0))
        if not np.isfinite(peak):
            return peak if np.isnan(peak) else float("inf")
        if peak > 0:
            total += peak * peak * be.item(be.sum(be.square(be.div(flat, peak))))
    return float(np.sqrt(total))


def clip_by_global_norm(backend: Backend | str, grads: Sequence[Tensor | None],
                        max_norm: float) -> tuple[list[Tensor | None], float]:
    """Scale every gradient by the same factor min(1, max_norm / global norm).

    Returns the clipped list (None entries stay None) and the norm before clipping. One
    common factor keeps the direction of the whole step and bounds its length: a step of
    SGD can then move the parameters by at most lr·max_norm, however steep the cliff."""
    require("the clipping norm", max_norm, "positive")
    be = get_backend(backend)
    total = global_norm(be, grads)
    if not np.isfinite(total):
        # An inf or nan gradient has no direction to keep; scaling would spread nan everywhere.
        raise SmallemError(f"clip_by_global_norm: the gradient norm is {total}: a gradient holds "
                           "inf or nan, which no scaling repairs; clip from the first step, or "
                           "lower the learning rate")
    if total <= max_norm:
        return list(grads), total
    scale = max_norm / total
    return [None if g is None else be.mul(g, scale) for g in grads], total

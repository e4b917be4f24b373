"""Diagnostics: numbers that say why training fails, measured on real tensors.

Sits beside the tape, below training code and notebooks: it reads activations and gradients
through the Backend protocol only, so it works the same on NumPy and CuPy. Notebook 08 (the
leaky abstraction) uses it for dead ReLUs, gradient norms and clipping; other lessons reuse it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..autodiff.tape import Var
from ..backends import Backend, Tensor, get_backend
from ..errors import SmallemError


def _tensor(x: Tensor | Var) -> Tensor:
    return x.value if isinstance(x, Var) else x


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

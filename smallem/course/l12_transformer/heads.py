"""What the trained Transformer's heads do (lesson 12), read off the model shipped as package data.

`closing_windows` cuts held-out windows that end on a `)` whose `(` is inside them; `weights_of`
runs a model over windows and returns every head's attention; `weight_on` measures how much
one position gives chosen bytes; `plot_head_maps` draws every head of every block as a T × T map.
Nothing here trains; notebook 12 calls it on `lessons.trained("transformer_trained")`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...autodiff.tape import Tape
from ...errors import SmallemError
from ..common.attention import attention_weights, byte_label, opener_distances

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def closing_windows(tokens: np.ndarray, context: int, reach: tuple[int, int],
                    count: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Windows of `context` bytes that end on a `)` whose `(` is `reach` = (lo, hi) bytes back
    (inclusive), evenly spaced over the stream, at most `count`: (windows (N, context), where the
    `(` of each last `)` sits (N,)). The `)` is at context − 1, its predictor at context − 2."""
    lo, hi = reach
    if not 1 <= lo <= hi < context:
        raise SmallemError(f"reach {reach} must lie between 1 and {context - 1} bytes back, "
                           "inside the window")
    found = opener_distances(tokens)
    ends = np.array(sorted(i for i, d in found.items() if i >= context - 1 and lo <= d <= hi), np.int64)
    if count is not None and len(ends) > count:
        ends = ends[np.linspace(0, len(ends) - 1, count).round().astype(np.int64)]
    if not len(ends):
        raise SmallemError(f"no `)` of this text has its `(` {lo} to {hi} bytes back")
    windows = np.stack([tokens[e - context + 1:e + 1] for e in ends]).astype(np.int64)
    return windows, np.array([context - 1 - found[e] for e in ends], np.int64)


def weights_of(model: Any, windows: np.ndarray, batch: int = 64) -> np.ndarray:
    """Every head's attention over each window: (L, N, H, T, T), read off forward tapes."""
    out = []
    for start in range(0, len(windows), batch):
        tape = Tape("cpu")
        model.logits(tape, np.asarray(windows[start:start + batch]))
        out.append(attention_weights(tape))
        tape.close()
    return np.concatenate(out, axis=1)


def weight_on(weights: np.ndarray, position: int, targets: np.ndarray) -> np.ndarray:
    """weights (L, N, H, T, T): what `position` of window n gives byte targets[n], (L, N, H);
    targets may also be a boolean (N, T) mask, whose bytes' weights are summed."""
    row = weights[:, :, :, position, :]                                   # (L, N, H, T)
    targets = np.asarray(targets)
    if targets.dtype == bool:
        return (row * targets[None, :, None, :]).sum(-1)
    index = np.broadcast_to(targets[None, :, None, None], row.shape[:3] + (1,))
    return np.take_along_axis(row, index, -1)[..., 0]


def plot_head_maps(weights: np.ndarray, tokens: np.ndarray | None = None, *, position: int | None = None,
                   target: int | None = None, title: str = "") -> Figure:
    """Every head of every block as a T × T map (rows: the position looking, columns: what it
    looks at), weights (L, H, T, T). Above the diagonal is the causal mask (hatched grey); the
    colour is √weight, so that small weights show. `position` marks a row, `target` a column."""
    import matplotlib.pyplot as plt

    weights = np.asarray(weights, np.float64)
    if weights.ndim != 4 or weights.shape[2] != weights.shape[3]:
        raise SmallemError(f"plot_head_maps needs weights (layers, heads, T, T), got {list(weights.shape)}")
    layers, heads, t, _ = weights.shape
    fig, axes = plt.subplots(layers, heads, figsize=(2.6 * heads, 2.7 * layers + 0.5), squeeze=False,
                             sharex=True, sharey=True, layout="constrained")
    hidden = np.triu(np.ones((t, t), bool), 1)
    for (layer, head), ax in np.ndenumerate(axes):
        ax.set_facecolor("#e6e6e6")
        image = ax.imshow(np.ma.masked_where(hidden, np.sqrt(weights[layer, head])), cmap="Reds",
                          vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"block {layer} · head {head}", fontsize=9)
        if position is not None:
            ax.axhline(position, color="#1f4e79", lw=0.8, ls="--")
        if target is not None:
            ax.axvline(target, color="#1f4e79", lw=0.8, ls=":")
        if tokens is not None and target is not None and layer == layers - 1:
            ax.set_xlabel(f"looked at (column {target}: {byte_label(tokens[target])!r})", fontsize=8)
        elif layer == layers - 1:
            ax.set_xlabel("looked at", fontsize=8)
        if head == 0:
            ax.set_ylabel("position looking", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.6, label="√ weight")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig

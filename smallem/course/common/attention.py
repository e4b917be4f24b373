"""What a Transformer's heads look at (lesson 12), and the recorded GPU run it shows.

`attention_weights` reads the attention weights off a forward tape (the nodes named "softmax",
one per layer, in order); `render_html` draws a snippet of bytes with each earlier byte shaded
by the weight one position gives it (a pure function: text and weights in, HTML out);
`AttentionView` is the ipywidgets view over it (layer, head and position), whose HTML is a
contract with the browser test (`data-pos`, `data-weight` on every byte). `recorded_run(name)` reads a
run stored as package data in lesson 12's folder (l12_transformer/recorded/).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
import numpy as np

from ...autodiff.operations import cross_entropy
from ...autodiff.tape import Tape
from ...backends import Backend
from ...data import VOCAB, windows
from ...errors import SmallemError
from ...nn import Embedding, Linear, Module
from .recordings import recorded as recorded_result
from .widgets import LABELS_HTML, _stored_note, redraw_on

VIEW_CLASS = "smallem-attention"  # the browser test finds the view by these classes
POSITION_CLASS = "smallem-attention-position"
HEAD_CLASS = "smallem-attention-head"
LAYER_CLASS = "smallem-attention-layer"
TEXT_CLASS = "smallem-attention-text"
SHADE = (192, 57, 43)  # the weight's colour (plots.GRAD), its alpha the weight
SHOWN = {10: "⏎", 9: "⇥", 32: "·", 256: "␃"}  # bytes a reader could not otherwise see


def attention_weights(tape: Any) -> np.ndarray:
    """The attention weights recorded on a forward tape: (L, B, H, T, T), one per softmax node
    in the order the layers ran. Row i of [l, b, h] is what position i of head h looked at."""
    found = [np.asarray(tape.backend.to_numpy(node.value), np.float64) for node in tape.nodes
             if node.op is not None and node.name == "softmax"]
    if not found:
        raise SmallemError("this tape holds no softmax node: run the model's forward on it first")
    return np.stack([w if w.ndim == 4 else w[:, None] for w in found])


def byte_label(token: int) -> str:
    """How one token reads in the view: the character, or a visible stand-in."""
    token = int(token)
    if token in SHOWN:
        return SHOWN[token]
    if 32 < token < 127:
        return chr(token)
    return f"\\x{token:02x}"


def render_html(tokens: Sequence[int], weights: Sequence[float], position: int, *,
                caption: str = "") -> str:
    """The snippet as HTML: byte j (j ≤ position) shaded by weights[j], the chosen position
    outlined, later bytes greyed (the head cannot see them). Every byte is a <span> with
    data-pos and data-weight (4 decimals; empty after the position)."""
    tokens, weights = np.asarray(tokens), np.asarray(weights, np.float64)
    if tokens.ndim != 1 or weights.shape != tokens.shape:
        raise SmallemError(f"render_html needs one weight per byte: {tokens.size} bytes and "
                           f"weights of shape {list(weights.shape)}")
    if not 0 <= position < tokens.size:
        raise SmallemError(f"position {position} is outside the snippet of {tokens.size} bytes")
    top = max(float(weights[:position + 1].max()), 1e-12)  # the strongest weight: full colour
    spans = []
    for j, token in enumerate(tokens.tolist()):
        label = html.escape(byte_label(token))
        style = "padding:1px 0;border-radius:2px;"
        if j > position:
            style += "color:#bbbbbb;"
            weight = ""
        else:
            alpha = float(weights[j]) / top
            style += f"background:rgba({SHADE[0]},{SHADE[1]},{SHADE[2]},{alpha:.3f});"
            weight = f"{weights[j]:.4f}"
        if j == position:
            style += "outline:2px solid #1f4e79;"
        spans.append(f'<span data-pos="{j}" data-weight="{weight}" style="{style}" '
                     f'title="byte {j}: {weight or "not visible"}">{label}</span>'
                     + ("<br>" if token == 10 else ""))
    head = f"<div style='margin-bottom:4px'>{html.escape(caption)}</div>" if caption else ""
    return (f"<div class='{TEXT_CLASS}-body' style=\"font-family:monospace;font-size:14px;"
            f"line-height:1.7;white-space:pre-wrap\">{head}{''.join(spans)}</div>")


def samples_html(texts: dict[str, str], prompt: str = "") -> str:
    """Generated texts side by side, one column each under its name: code as written, left-aligned
    in <pre> so its indentation is kept (a notebook's table cells would centre or right-align it)."""
    cells = "".join(
        f"<td style='vertical-align:top;text-align:left;padding-right:1em'><b>{html.escape(name)}</b>"
        f"<pre style='text-align:left;white-space:pre-wrap;margin:0.4em 0'>{html.escape(prompt + text)}"
        "</pre></td>"
        for name, text in texts.items())
    return f"<table style='table-layout:fixed;width:100%'><tr>{cells}</tr></table>"


def strongest(weights: Sequence[float], position: int, k: int = 3) -> list[int]:
    """The k positions that `position` weighs most, strongest first."""
    row = np.asarray(weights, np.float64)[:position + 1]
    return [int(j) for j in np.argsort(-row, kind="stable")[:k]]


class AttentionView(widgets.VBox):
    """Pick a layer, a head and a position over a snippet; the earlier bytes are shaded by the
    weight that head gives them. `weights` is (L, H, T, T) for the T bytes of `tokens`."""

    def __init__(self, tokens: Sequence[int], weights: np.ndarray, *, position: int | None = None,
                 layer: int = 0, head: int = 0) -> None:
        self.tokens = np.asarray(tokens)
        self.weights = np.asarray(weights, np.float64)
        if self.weights.ndim != 4 or self.weights.shape[2:] != (self.tokens.size,) * 2:
            raise SmallemError(f"AttentionView needs weights (layers, heads, T, T) for the "
                               f"{self.tokens.size} bytes, got {list(self.weights.shape)}")
        layers, heads, t, _ = self.weights.shape
        wide = {"description_width": "70px"}
        self.layer = widgets.IntSlider(value=layer, min=0, max=layers - 1, description="layer",
                                       style=wide, continuous_update=False)
        self.layer.add_class(LAYER_CLASS)
        self.head = widgets.IntSlider(value=head, min=0, max=heads - 1, description="head",
                                      style=wide, continuous_update=False)
        self.head.add_class(HEAD_CLASS)
        self.position = widgets.IntSlider(value=t - 1 if position is None else position, min=0,
                                          max=t - 1, description="position", style=wide,
                                          continuous_update=False, layout=widgets.Layout(width="560px"))
        self.position.add_class(POSITION_CLASS)
        self.text = widgets.HTML()
        self.text.add_class(TEXT_CLASS)
        super().__init__(children=[widgets.HBox([self.layer, self.head]), self.position, self.text])
        self.add_class(VIEW_CLASS)
        redraw_on([self.layer, self.head, self.position], self._update)
        self._update()

    def row(self) -> np.ndarray:
        """The weights the chosen position gives every byte, for the chosen layer and head."""
        return self.weights[self.layer.value, self.head.value, self.position.value]

    def caption(self) -> str:
        p = int(self.position.value)
        top = ", ".join(f"{j} {byte_label(self.tokens[j])!r} {self.row()[j]:.2f}"
                        for j in strongest(self.row(), p))
        return (f"layer {self.layer.value} · head {self.head.value} · position {p} "
                f"{byte_label(self.tokens[p])!r} · strongest: {top}")

    def _update(self) -> None:
        self.text.value = render_html(self.tokens, self.row(), int(self.position.value),
                                      caption=self.caption()) + LABELS_HTML  # handles named: "position 63"

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return _stored_note(super()._repr_mimebundle_(**kwargs),
                            "The attention view appears here when the notebook runs (JupyterLab "
                            "does not save widget state); the static views below show the same "
                            "weights.")


# -- lesson 11's one-head model, its mask an argument --------------------------------------------

def masked_softmax(tape: Any, scores: Any, allowed: np.ndarray) -> Any:
    """Softmax over the last axis where `allowed` (T, T) is True, exactly 0 elsewhere, from
    five nodes: a constant (each row's max where allowed, +∞ where masked), sub, exp (e⁻∞ = 0),
    a row sum and a division."""
    allowed = np.asarray(allowed, bool)
    values = np.asarray(tape.backend.to_numpy(scores.value), np.float64)
    row_max = np.where(allowed, values, -np.inf).max(axis=-1, keepdims=True)
    e = tape.exp(scores - tape.constant(np.where(allowed, row_max, np.inf)))
    return e / tape.sum(e, -1, keepdim=True)


class OneHeadLM(Module):
    """Lesson 11's smallest attention language model: token and position embeddings (C), one
    head (D = C) whose output is added back to its input, and a linear map to the 257 logits.
    `allowed` (T, T) is the mask its softmax applies: the causal one, or any other."""

    def __init__(self, allowed: np.ndarray, *, dim: int = 32, backend: Backend | str = "cpu",
                 seed: int = 0) -> None:
        self.allowed = np.asarray(allowed, bool)
        rng = np.random.default_rng(seed)
        t = self.allowed.shape[0]
        self.tokens = Embedding(VOCAB, dim, backend=backend, rng=rng)
        self.positions = Embedding(t, dim, backend=backend, rng=rng)
        self.query = Linear(dim, dim, backend=backend, rng=rng, bias=False)
        self.key = Linear(dim, dim, backend=backend, rng=rng, bias=False)
        self.value = Linear(dim, dim, backend=backend, rng=rng, bias=False)
        self.output = Linear(dim, VOCAB, backend=backend, rng=rng)

    def logits(self, tape: Any, tokens: Any) -> Any:
        """tokens (B, T) → logits (B, T, V): every position predicts the byte after it."""
        b, t = np.shape(tokens)
        x = self.tokens(tape, tokens) + self.positions(tape, np.arange(t))        # (B, T, C)
        q, k, v = self.query(tape, x), self.key(tape, x), self.value(tape, x)
        scores = q @ tape.transpose(k) / float(np.sqrt(q.shape[-1]))             # (B, T, T)
        return self.output(tape, x + masked_softmax(tape, scores, self.allowed[:t, :t]) @ v)

    def loss(self, tape: Any, tokens: Any, targets: Any) -> Any:
        """The mean cross-entropy over every position of every sequence."""
        logits = self.logits(tape, tokens)
        return cross_entropy(tape, tape.reshape(logits, (-1, VOCAB)), np.reshape(targets, -1))

    def last_loss(self, tokens: np.ndarray, targets: np.ndarray) -> float:
        """The loss at the last position only: the byte after the window, as the MLP is scored."""
        return float(_nll(self, tokens, targets).mean())


# -- where the window ends: closing parentheses and their openers --------------------------------

def opener_distances(tokens: np.ndarray) -> dict[int, int]:
    """For every `)` of a token stream whose `(` is found: how many bytes back that `(` is
    (a stack per document; token 256 starts a new one)."""
    stack: list[int] = []
    found: dict[int, int] = {}
    for i, t in enumerate(np.asarray(tokens).tolist()):
        if t == 256:
            stack = []
        elif t == 40:  # (
            stack.append(i)
        elif t == 41 and stack:  # )
            found[i] = i - stack.pop()
    return found


def losses_at(model: Any, tokens: np.ndarray, positions: np.ndarray, context: int,
              batch: int = 1024) -> np.ndarray:
    """The loss of `model` on the byte at each position, predicted from the `context` bytes
    before it: the MLP's one prediction, or a sequence model's last position."""
    out = []
    for start in range(0, len(positions), batch):
        contexts, targets = windows(tokens, np.asarray(positions[start:start + batch]), context)
        out.append(_nll(model, contexts, targets))
    return np.concatenate(out)


def _nll(model: Any, contexts: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """−log p(target) for each row, from the model's logits at the last position."""
    tape = Tape(model.parameters()[0].value.dtype == np.float64 and "cpu64" or "cpu")
    logits = np.asarray(tape.backend.to_numpy(model.logits(tape, contexts).value), np.float64)
    tape.close()
    logits = logits[:, -1] if logits.ndim == 3 else logits
    logits = logits - logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(targets)), targets]


# -- recorded runs ------------------------------------------------------------------------------

# What notebook 12 reads from a recorded run (TrainResult.to_json() has all but the last);
# optional: "samples" {name: text}, "held_out_every_position".
RECORDED_KEYS = ("device", "config", "steps", "batch", "wall_seconds", "history", "held_out_loss",
                 "mlp_held_out_loss", "mlp", "window16")  # the MLP's run and the 16-byte one beside it


def recorded_run(name: str) -> dict[str, Any] | None:
    """A recorded run (a lesson's recorded/<name>.json, package data), or None while the file
    there is still the placeholder (`"placeholder": true`) that a real run replaces."""
    data = recorded_result(name)
    if data.get("placeholder"):
        return None
    missing = [key for key in RECORDED_KEYS if key not in data]
    if missing:
        raise SmallemError(f"the recorded run {name!r} lacks {', '.join(missing)}")
    return data


def recorded_curve(run: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, held-out losses) of a recorded run: its evaluations only."""
    points = [(r["step"], r["held_out_loss"]) for r in run["history"] if r.get("held_out_loss") is not None]
    steps, losses = zip(*points) if points else ((), ())
    return np.array(steps, np.float64), np.array(losses, np.float64)

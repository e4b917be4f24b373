"""Backward, one node at a time: the reverse walk of a tape as data, and a widget over it.

`BackwardWalk` consumes `tape.backward_steps(loss)` (one `BackwardStep` per node processed) and
keeps, for every point of the walk, the gradient each node has accumulated so far, as host
NumPy arrays (GPU tapes are copied with `backend.to_numpy`). `StepThrough` is a thin ipywidgets
view over it: Prev/Next and a slider, the graph drawn as inline SVG, one step's rule.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets
import numpy as np

from ...autodiff.tape import BackwardStep, Gradients, Tape, Var
from ...errors import fmt
from .widgets import LABELS_HTML, redraw_on

# The browser test finds the step-through widget's parts by these classes.
STEP_CLASS = "smallem-stepthrough"  # the whole widget
STEP_INFO_CLASS = "smallem-step-info"  # the line saying what the current step does
STEP_GRAPH_CLASS = "smallem-step-graph"  # the graph (an inline SVG)
STEPTHROUGH_SLIDER_CLASS = "smallem-stepthrough-slider"  # the slider over the walk's points


@dataclass(frozen=True)
class Received:
    """One contribution a node received: at which step (1-based), from which node, how much."""

    step: int
    source: int
    value: np.ndarray


class BackwardWalk:
    """The reverse walk of `tape` from `loss`, with the state at every point of it.

    Point 0 is the start (only the loss holds a gradient, 1); point k (1 ≤ k ≤ len(steps)) is
    the state after the k-th step. `names` gives nodes readable labels ({var: "a"})."""

    def __init__(self, tape: Tape, loss: Var, names: Mapping[Var, str] | None = None) -> None:
        self.tape = tape
        self.loss = loss.index
        self.names = {v.index: n for v, n in (names or {}).items()}
        be = tape.backend
        self.values = [self.host(node.value) for node in tape.nodes]
        self.steps: list[BackwardStep] = []  # tape.backward_steps' records, in order
        # Accumulate on the backend, as backward does, so the last state is its result bit for bit.
        acc: list[Any] = [None] * len(tape.nodes)
        acc[self.loss] = be.full(tape.nodes[self.loss].shape, 1.0)
        self.states: list[list[np.ndarray | None]] = [self._snapshot(acc)]
        self.received: list[list[Received]] = [[] for _ in tape.nodes]
        for step in tape.backward_steps(loss):
            self.steps.append(step)
            k = len(self.steps)
            for j, c in zip(step.inputs, step.contributions):
                if c is None:
                    continue
                acc[j] = c if acc[j] is None else be.add(acc[j], c)
                self.received[j].append(Received(k, step.index, self.host(c)))
            self.states.append(self._snapshot(acc))

    def host(self, x: Any) -> np.ndarray:
        return np.asarray(self.tape.backend.to_numpy(x))

    def _snapshot(self, acc: list[Any]) -> list[np.ndarray | None]:
        return [None if g is None else self.host(g).copy() for g in acc]

    def __len__(self) -> int:
        """The number of steps (the walk has len + 1 points, counting the start)."""
        return len(self.steps)

    def label(self, index: int) -> str:
        node = self.tape.nodes[index]
        return self.names.get(index, "") or node.name

    def received_until(self, index: int, point: int) -> list[Received]:
        """The contributions node `index` has received by point `point` of the walk."""
        return [r for r in self.received[index] if r.step <= point]

    def gradient(self, index: int, point: int | None = None) -> np.ndarray | None:
        """Node `index`'s accumulated gradient at `point` (default: the end)."""
        return self.states[len(self.steps) if point is None else point][index]

    def equals(self, grads: Gradients | list) -> bool:
        """True when the walk's final state is, bit for bit, `grads` (a tape.backward result on
        the same computation) for every node: same nodes holding one, same numbers."""
        final = self.states[-1]
        for index, mine in enumerate(final):
            theirs = grads.node(index) if isinstance(grads, Gradients) else grads[index]
            if (mine is None) != (theirs is None):
                return False
            if mine is not None:
                theirs = self.host(theirs)
                if mine.shape != theirs.shape or mine.dtype != theirs.dtype \
                        or not np.array_equal(mine, theirs):
                    return False
        return True

    def summary(self, point: int | None = None) -> list[tuple[int, str]]:
        """(node, its gradient as terms and sum) for every node holding one at `point`."""
        point = len(self.steps) if point is None else point
        out = []
        for i in range(len(self.tape.nodes)):
            terms, total = gradient_text(self, i, point)
            if total:
                out.append((i, total if len(terms) < 2 else " + ".join(terms) + " = " + total))
        return out

    def table_html(self, point: int | None = None) -> str:
        """A plain HTML table of the state at `point` (default: the end), for stored notebooks."""
        grads = dict(self.summary(point))
        rows = "".join(
            f"<tr><td>%{i}</td><td>{html.escape(self.label(i))}</td><td>{node.name}</td>"
            f"<td>{html.escape(fmt(self.values[i]))}</td><td>{html.escape(grads.get(i, ''))}</td></tr>"
            for i, node in enumerate(self.tape.nodes))
        return ("<table><thead><tr><th>#</th><th>name</th><th>op</th><th>value</th>"
                f"<th>gradient</th></tr></thead><tbody>{rows}</tbody></table>")

    def describe_parts(self, point: int) -> list[str]:
        """What step `point` did, in parts: which node, its rule, the gradient arriving, and
        what it adds into each input (point 0: the start)."""
        if point == 0:
            return [f"start: the loss %{self.loss} gets ∂L/∂L = 1",
                    f"{len(self.steps)} steps to go, from the last node back to the first"]
        step = self.steps[point - 1]

        def into(j: int, c: Any) -> str:
            name = self.tape.nodes[j].name
            who = f"%{j} {self.label(j)}" + ("" if self.label(j) == name else f" ({name})")
            return f"{fmt(self.host(c))} into {who}" if c is not None else f"nothing into {who}"

        return [f"step {point} of {len(self.steps)}: node %{step.index} {self.label(step.index)}",
                f"rule {step.op}: {step.formula}" + (" (fused)" if step.fused else ""),
                f"incoming gradient {fmt(self.host(step.grad))}",
                "adds " + "; ".join(into(j, c) for j, c in zip(step.inputs, step.contributions))]

    def describe(self, point: int) -> str:
        """One line saying what step `point` did (the widget shows the same parts)."""
        return " · ".join(self.describe_parts(point))


# the tape as a graph: inline SVG ----------------------------------------------------------------
# Nodes are boxes in tape order, top to bottom (the order backward reads from the bottom up); an
# arc on the left joins each input to the node that uses it. At one point of the walk the node
# being processed is orange, the inputs receiving a contribution are red, and each node's
# gradient column lists what it has received so far (`1 + 3 = 4` for a value used twice).
# Plain SVG text: crisp at any width, and readable by the browser test.
ROW = 38  # px per node
FONT = 13  # px
CHAR = 7.4  # px: a generous width of one character at FONT (for column widths)
EDGE, FLOW = "#9aa7b1", "#c0392b"  # an input arc; the gradient of the current step
PROCESSED_FILL, PROCESSED_EDGE = "#fdebd0", "#e67e22"
RECEIVES_FILL = "#fadbd8"
DONE_FILL = "#f2f4f5"
FLOW_CLASS = ' class="flow"'


def gradient_text(walk: BackwardWalk, index: int, point: int) -> tuple[list[str], str]:
    """What node `index`'s gradient column shows at `point`: the terms received so far and
    the total ('' before any). The loss starts at 1; a constant never gets one."""
    node = walk.tape.nodes[index]
    if index == walk.loss:
        return ["1 (∂L/∂L)"], fmt(walk.states[point][index])
    if not node.requires_grad:
        return [], ""
    terms = [fmt(r.value) for r in walk.received_until(index, point)]
    total = walk.states[point][index]
    return terms, "" if total is None else fmt(total)


LEGEND = ("grey arcs join a node's inputs to it · orange: the node being processed · red: the "
          "inputs it adds into this step · a value used twice lists both terms, then their sum")


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def tape_svg(walk: BackwardWalk, point: int, *, title: str = "") -> str:
    """The graph of `walk`'s tape at `point` (0 = start, k = after step k) as an <svg> string."""
    nodes = walk.tape.nodes
    n = len(nodes)
    step = walk.steps[point - 1] if point > 0 else None
    receiving = {j for j, c in zip(step.inputs, step.contributions) if c is not None} if step else set()
    done = {s.index for s in walk.steps[:max(point - 1, 0)]}

    rows = []
    for i, node in enumerate(nodes):
        terms, total = gradient_text(walk, i, point)
        if not node.requires_grad:
            grad = "no gradient (constant)" if node.op is None else "needs none"
        elif not terms:
            grad = "·"
        elif len(terms) == 1:
            grad = total if i != walk.loss else "1 (∂L/∂L)"
        else:
            grad = " + ".join(terms) + " = " + total
        label = walk.names.get(i, "")
        rows.append((f"%{i}", label, node.name, fmt(walk.values[i]), grad, terms, total))

    w_label = max(max(len(r[1]) + len(r[2]) + 3 for r in rows) * CHAR, 110)
    w_value = max(max(len(r[3]) for r in rows) * CHAR + 24, 90)
    w_grad = max(max(len(r[4]) for r in rows) * CHAR + 24, 150)
    spans = [i - j for i, node in enumerate(nodes) for j in node.inputs]
    depth = lambda span: 12 + 9 * span  # noqa: E731  (how far an arc bulges left)
    x0 = 12 + (depth(max(spans)) * 0.8 if spans else 0)
    col_label, col_value = x0 + 44, x0 + 44 + w_label
    col_grad = col_value + w_value
    width = col_grad + w_grad + 8
    top = (26 if title else 0) + 50
    height = top + n * ROW + 8

    def y(i: int) -> float:
        return top + i * ROW + ROW / 2

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="smallem-tape-svg" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" '
           f'style="max-width:100%;height:auto;font-family:sans-serif;font-size:{FONT}px" '
           f'data-point="{point}">',
           '<defs>'
           f'<marker id="fw" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{EDGE}"/></marker>'
           f'<marker id="bw" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="4.5" markerHeight="4.5" '
           f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{FLOW}"/></marker>'
           '</defs>']
    if title:
        out.append(f'<text x="8" y="20" font-size="14" font-weight="bold">{_esc(title)}</text>')
    where = ("start: the loss holds ∂L/∂L = 1" if step is None else
             f"step {point} of {len(walk)}: %{step.index} {step.op} sends its gradient back")
    out.append(f'<text x="8" y="{top - 30}" fill="#333">{_esc(where)}</text>')
    for name, x in (("value", col_value), ("gradient ∂L/∂·", col_grad)):
        out.append(f'<text x="{x + 8:.0f}" y="{top - 6}" fill="#777" font-size="11">{_esc(name)}</text>')

    # Arcs first, so boxes sit on top; the current step's arcs last, in red, pointing back.
    arcs = [(j, i) for i, node in enumerate(nodes) for j in node.inputs]
    current = [(j, step.index) for j in receiving] if step else []
    for j, i in sorted(arcs, key=lambda arc: arc in current):
        back = (j, i) in current
        bulge = depth(i - j)
        ya, yb = y(j) + 5, y(i) - 5
        start, end = ((x0, yb), (x0, ya)) if back else ((x0, ya), (x0, yb))
        c1, c2 = (x0 - bulge, start[1]), (x0 - bulge, end[1])
        out.append(f'<path d="M{start[0]:.1f},{start[1]:.1f} C{c1[0]:.1f},{c1[1]:.1f} '
                   f'{c2[0]:.1f},{c2[1]:.1f} {end[0]:.1f},{end[1]:.1f}" fill="none" '
                   f'stroke="{FLOW if back else EDGE}" stroke-width="{2.2 if back else 1.2}" '
                   f'marker-end="url(#{"bw" if back else "fw"})"'
                   f'{FLOW_CLASS if back else ""}/>')

    for i, (tag, label, kind, value, grad, terms, total) in enumerate(rows):
        processed = step is not None and i == step.index
        fill = (PROCESSED_FILL if processed else RECEIVES_FILL if i in receiving
                else DONE_FILL if i in done else "white")
        stroke, sw = ((PROCESSED_EDGE, 2.5) if processed else (FLOW, 2) if i in receiving
                      else ("#1f4e79", 1) if nodes[i].requires_grad else ("#b0b0b0", 1))
        out.append(f'<g class="node" data-index="{i}" data-grad="{_esc(total)}" '
                   f'data-terms="{len(terms)}">')
        out.append(f'<rect x="{x0:.1f}" y="{y(i) - ROW / 2 + 3:.1f}" width="{width - x0 - 4:.1f}" '
                   f'height="{ROW - 6}" rx="5" fill="{fill}" stroke="{stroke}" stroke-width="{sw}"/>')
        base = y(i) + FONT * 0.35
        out.append(f'<text x="{x0 + 8:.1f}" y="{base:.1f}" fill="#777">{tag}</text>')
        grey = "" if nodes[i].requires_grad else ' fill="#888"'
        who = (f'<tspan font-weight="bold">{_esc(label)}</tspan> ' if label else "")
        out.append(f'<text x="{col_label:.1f}" y="{base:.1f}"{grey}>{who}'
                   f'<tspan{"" if label else " font-weight=" + chr(34) + "bold" + chr(34)}>'
                   f'{_esc(kind)}</tspan></text>')
        out.append(f'<text x="{col_value + 8:.1f}" y="{base:.1f}" font-family="monospace"{grey}>'
                   f'{_esc(value)}</text>')
        colour = FLOW if i in receiving or (i == walk.loss and point == 0) else (
            "#222" if terms else "#999")
        weight = ' font-weight="bold"' if i in receiving else ""
        out.append(f'<text class="grad" x="{col_grad + 8:.1f}" y="{base:.1f}" '
                   f'font-family="monospace" fill="{colour}"{weight}>{_esc(grad)}</text>')
        out.append("</g>")

    out.append("</svg>")
    return "".join(out)


class StepThrough(widgets.VBox):
    """Prev / Next buttons and a slider over a BackwardWalk; the graph and the step's rule are
    drawn together into one HTML widget, so they always change in the same update."""

    def __init__(self, walk: BackwardWalk, *, point: int | None = None, title: str = "") -> None:

        self.walk = walk
        self.title = title
        n = len(walk)
        self.prev = widgets.Button(description="◀ Prev", layout=widgets.Layout(width="90px"),
                                   tooltip="the step before (one node later on the tape)")
        self.next = widgets.Button(description="Next ▶", layout=widgets.Layout(width="90px"),
                                   tooltip="the next step of backward (one node earlier)")
        self.slider = widgets.IntSlider(value=n if point is None else point, min=0, max=n,
                                        description="step", continuous_update=True,
                                        style={"description_width": "40px"},
                                        layout=widgets.Layout(width="420px"))
        self.slider.add_class(STEPTHROUGH_SLIDER_CLASS)
        self.view = widgets.HTML()
        self.prev.on_click(lambda _: self._move(-1))
        self.next.on_click(lambda _: self._move(+1))
        redraw_on([self.slider], self._draw)
        super().__init__(children=[widgets.HBox([self.prev, self.next, self.slider]), self.view])
        self.add_class(STEP_CLASS)
        self._draw()

    @property
    def point(self) -> int:
        return int(self.slider.value)

    def _move(self, delta: int) -> None:
        self.slider.value = min(max(self.point + delta, 0), len(self.walk))

    def html(self, point: int) -> str:
        head, *rest = self.walk.describe_parts(point)
        info = f"<b>{html.escape(head)}</b>" + "".join(f"<br>{html.escape(p)}" for p in rest)
        return (f'<div class="{STEP_INFO_CLASS}" data-point="{point}" '
                f'style="font-size:13px;line-height:1.5;margin:4px 0 6px 0;max-width:760px">'
                f"{info}</div>"
                f'<div class="{STEP_GRAPH_CLASS}">{tape_svg(self.walk, point, title=self.title)}</div>'
                f'<div style="font-size:11px;color:#777">{html.escape(LEGEND)}</div>')

    def _draw(self) -> None:
        self.prev.disabled = self.point == 0
        self.next.disabled = self.point == len(self.walk)
        self.view.value = self.html(self.point) + LABELS_HTML  # the slider's handle named "step"

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if data is not None:  # what a stored notebook shows where the widget cannot be drawn
            note = ("The step-through widget appears here when the cell runs (JupyterLab does "
                    "not save widget state). The walk's end state:")
            data["text/plain"] = note + "\n" + "\n".join(
                f"  %{i} {self.walk.label(i)}: gradient {g}" for i, g in self.walk.summary())
            data["text/html"] = f"<p><i>{html.escape(note)}</i></p>" + self.walk.table_html()
        return bundle

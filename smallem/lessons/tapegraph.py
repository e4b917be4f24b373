"""The tape as a graph, drawn as inline SVG for the step-through widget (stepthrough.py).

Nodes are boxes in tape order, top to bottom (the order backward reads from the bottom up);
an arc on the left joins each input to the node that uses it. At one point of the walk the
node being processed is orange, the inputs receiving a contribution are red, and each node's
gradient column lists what it has received so far (`1 + 3 = 4` for a value used twice).
Plain SVG text: crisp at any width, and readable by the browser test.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .stepthrough import BackwardWalk

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
    from .stepthrough import fmt

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
    from .stepthrough import fmt

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


"""ipywidgets views for the notebooks: the learning-rate cliff of lesson 07, a figure under
sliders (`LiveFigure`, lesson 08's |λ|), and the one way every view redraws (`redraw_on`).

`LearningRateCliff` trains the 2-2-1 toy network (models/toy.py) at the slider's learning
rate and shows one step of it with plots.py. Its status line is a contract with the browser
test: an HTML widget of class `smallem-status` reading, exactly,
`learning rate 0.5000 · final loss 0.50000 · dead units: 2/2` (the run's LAST step, whatever
step the figure shows). The figure's <img> says what it drew (alt text, data-units).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as widgets
from matplotlib.figure import Figure

from ...models.toy import CLIFF_STEPS, StepRecord, gradient_descent
from .plots import STEP_FIGSIZE, plot_step, unit_marks

STATUS_CLASS = "smallem-status"  # the browser test finds the status line by this class
SLIDER_CLASS = "smallem-lr"  # ... the learning-rate slider by this one
CLIFF_STEP_SLIDER_CLASS = "smallem-cliff-step"  # ... the slider choosing the step shown
FIGURE_CLASS = "smallem-figure"  # ... and the HTML widget holding the figure's <img>
LIVE_FIGURE_CLASS = "smallem-live-figure"  # a LiveFigure's picture (lesson 08's |λ| slider)
DPI = 100  # the PNG is shown at its own size: 8 inches = 800 px, JupyterLab's usual width
LR_STEP = 0.05  # slider step in log10 units: one arrow key ×1.12, 40 presses from 0.01 to 1


def status_text(records: Sequence[StepRecord]) -> str:
    """The status line for one run: learning rate (4 decimals), loss after the LAST step
    (5 decimals), dead hidden units at the end out of 2; for leaky units, their slope."""
    last = records[-1]
    text = (f"learning rate {last.lr:.4f} · final loss {last.loss:.5f} · "
            f"dead units: {last.dead_count}/2")
    if last.slope:
        text += f" · leaky slope {last.slope:g}, {sum(last.below_zero)}/2 units below zero"
    return text


# noUiSlider, under ipywidgets' FloatLogSlider, announces the slider's exponent to screen
# readers (aria-valuetext "-0.3" for 0.5000), and ipywidgets does not expose its ariaFormat.
# An invisible image in the hint installs, once rendered, an observer that copies the readout
# (the learning rate as shown) into the handle's aria-valuetext whenever either changes.
_ANNOUNCE = (
    "(function(img){var n=0;(function hook(){var box=img.closest('.widget-vbox'),"
    f"s=box&&box.querySelector('.{SLIDER_CLASS}'),h=s&&s.querySelector('.noUi-handle'),"
    "r=s&&s.querySelector('.widget-readout');if(!h||!r){if(n++<200)setTimeout(hook,50);return;}"
    "var sync=function(){var t=r.textContent.trim();"
    "if(t&&h.getAttribute('aria-valuetext')!==t)h.setAttribute('aria-valuetext',t);};"
    "new MutationObserver(sync).observe(h,{attributes:true,attributeFilter:['aria-valuetext']});"
    "new MutationObserver(sync).observe(r,{childList:true,characterData:true,subtree:true});"
    "sync();})();})(this)")
_GIF = "data:image/gif;base64,R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7"  # 1×1
ANNOUNCE_HTML = (f'<img alt="" width="0" height="0" style="display:none" src="{_GIF}" '
                 f'onload="{html.escape(_ANNOUNCE)}">')


# ipywidgets' sliders give their handle no accessible name (a screen reader says "slider 63"). The
# same invisible-image hook names each handle in the view after its slider's description
# ("position 63"), once rendered and again after every redraw of the HTML it sits in.
_LABELS = (
    "(function(img){var n=0;(function hook(){var box=img.closest('.widget-vbox'),"
    "s=box?box.querySelectorAll('.widget-slider'):[];if(!s.length){if(n++<200)setTimeout(hook,50);return;}"
    "s.forEach(function(e){var l=e.querySelector('.widget-label'),h=e.querySelector('.noUi-handle');"
    "if(l&&h&&l.textContent.trim())h.setAttribute('aria-label',l.textContent.trim());});})();})(this)")
LABELS_HTML = (f'<img alt="" width="0" height="0" style="display:none" src="{_GIF}" '
               f'onload="{html.escape(_LABELS)}">')


def redraw_on(controls: Sequence[widgets.Widget], render: Callable[[], Any]) -> None:
    """Call `render()` after every change of any control's value. `render` reads the values as
    they are now (never the event's own) and replaces whole HTML widget values, one message each
    (no Output widget cleared, then refilled): however fast the events come, the kernel's last
    redraw shows the last value, readout and picture together, and the view is never empty."""
    for control in controls:
        control.observe(lambda _change: render(), names="value")


def png_html(fig: Figure, alt: str, extra: Callable[[], str] = str) -> str:
    """The figure as an <img> (PNG, at DPI) whose alt text says what it shows; `extra()`, called
    once the figure is drawn, gives more attributes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)  # fig.dpi is DPI too, so positions read after agree
    source = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (f'<img src="data:image/png;base64,{source}" alt="{html.escape(alt)}"{extra()} '
            'style="max-width:100%">')


def figure_html(fig: Figure, alt: str) -> str:
    """The figure as an <img> (PNG) whose alt text says what it shows, and whose data-units
    attribute says what was drawn for each unit (fill, hatch, where, in PNG pixels): the
    browser test reads both and checks the pixels against them."""
    return png_html(fig, alt, lambda: f" data-units='{html.escape(json.dumps(unit_marks(fig)), False)}'")


class LearningRateCliff(widgets.VBox):
    """A learning-rate slider over the 2-2-1 network: every number of the chosen step on
    the network figure, the loss against step, and a one-line status.

    `lr_slider` is a FloatLogSlider from 0.01 to 1 (exponents −2 to 0) whose readout can be
    typed into (so 0.1 and 0.5 are exact); `step_slider` picks the step the figure shows;
    `slope` the hidden units' slope below zero (0: ReLU; 0.01, 0.1: leaky ReLU); `status`
    is the HTML status line; `figure` the HTML widget with the picture; `records` the run."""

    def __init__(self, lr: float = 0.1, *, steps: int = CLIFF_STEPS, show_step: int = 3,
                 slope: float = 0.0) -> None:
        self.steps = steps
        wide = {"description_width": "110px"}
        self.lr_slider = widgets.FloatLogSlider(
            value=lr, base=10, min=-2, max=0, step=LR_STEP, description="learning rate η",
            readout=True, readout_format=".4f",
            continuous_update=False,  # train and redraw once, on release, not per pixel
            style=wide, layout=widgets.Layout(width="560px"))
        self.lr_slider.add_class(SLIDER_CLASS)
        self.step_slider = widgets.IntSlider(
            value=min(show_step, steps), min=0, max=steps, description="show step",
            continuous_update=False, style=wide, layout=widgets.Layout(width="560px"))
        self.step_slider.add_class(CLIFF_STEP_SLIDER_CLASS)
        self.slope = widgets.ToggleButtons(
            options=[("ReLU", 0.0), ("leaky 0.01", 0.01), ("leaky 0.1", 0.1)], value=slope,
            description="hidden units", style={**wide, "button_width": "90px"})
        self.status = widgets.HTML()
        self.status.add_class(STATUS_CLASS)
        self.figure = widgets.HTML()
        self.figure.add_class(FIGURE_CLASS)
        self.records: list[StepRecord] = []
        hint = widgets.HTML(
            f"<i>Drag the learning rate (or focus it and use the arrow keys), or click its "
            f"number and type one (try 0.1, then 0.5); each change trains {steps} steps of "
            f"gradient descent.</i>" + ANNOUNCE_HTML)
        super().__init__(children=[hint, self.lr_slider, self.step_slider, self.slope,
                                   self.status, self.figure])
        redraw_on([self.lr_slider, self.slope], self._update)
        redraw_on([self.step_slider], self._update_figure)
        self._update()

    def _update(self) -> None:
        self.records = gradient_descent(float(self.lr_slider.value), self.steps,
                                        slope=float(self.slope.value))
        picture = self._picture()  # the slow part first: then status and figure move together
        self.status.value = status_text(self.records)
        self.figure.value = picture

    def _update_figure(self) -> None:
        self.figure.value = self._picture()

    def _picture(self) -> str:
        step = int(self.step_slider.value)
        record = self.records[step]
        # A pyplot-free Figure: redrawing from a callback never touches pyplot's figure list.
        fig = plot_step(self.records, step, Figure(figsize=STEP_FIGSIZE, dpi=DPI,
                                                   layout="constrained"))
        alt = (f"network at step {step}, learning rate {record.lr:.4f}: loss {record.loss:.5f}, "
               f"dead units {record.dead_count}/2")
        return figure_html(fig, alt)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return _stored_note(super()._repr_mimebundle_(**kwargs),
                            "The learning-rate widget appears here when the notebook runs "
                            "(JupyterLab does not save widget state); the figures below show "
                            "the same views.")


def _stored_note(bundle: Any, note: str) -> Any:
    """Replace a widget's raw repr (`LearningRateCliff(children=(HTML(...`) by `note`: that is
    what a stored, not yet run notebook shows in place of the widget."""
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    if data is not None:
        data["text/plain"] = note
        data["text/html"] = f"<p><i>{html.escape(note)}</i></p>"
    return bundle


def _as_read(control: widgets.Widget, value: Any) -> str:
    """`value` as the control's readout shows it (".2f": 1.00), so picture and readout can be compared."""
    try:
        return format(value, getattr(control, "readout_format", "") or "")
    except (TypeError, ValueError):
        return str(value)


class LiveFigure(widgets.VBox):
    """Controls over a figure that `draw(fig, *values)` fills (a pyplot-free Figure, one value per
    control, in order), redrawn through `redraw_on` like every view here; a stored notebook shows
    `note` (one honest sentence) in its place."""

    def __init__(self, controls: Sequence[widgets.ValueWidget], draw: Callable[..., Any], *, note: str,
                 figsize: tuple[float, float] = (6.0, 3.4)) -> None:
        self.controls, self.draw, self.note, self.figsize = list(controls), draw, note, figsize
        self.figure = widgets.HTML()
        self.figure.add_class(LIVE_FIGURE_CLASS)
        super().__init__(children=[*self.controls, self.figure])
        redraw_on(self.controls, self.redraw)
        self.redraw()

    def values(self) -> list[Any]:
        return [control.value for control in self.controls]

    def redraw(self) -> None:
        values = self.values()  # read once: the picture and its alt text say the same values
        fig = Figure(figsize=self.figsize, dpi=DPI, layout="constrained")
        self.draw(fig, *values)
        alt = "figure for " + ", ".join(f"{c.description or 'value'} = {_as_read(c, v)}"
                                        for c, v in zip(self.controls, values))
        self.figure.value = png_html(fig, alt, lambda: f" data-values='{html.escape(json.dumps(values))}'")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return _stored_note(super()._repr_mimebundle_(**kwargs), self.note)

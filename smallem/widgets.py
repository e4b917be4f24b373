"""ipywidgets views for the notebooks: the learning-rate cliff of lesson 07.

`LearningRateCliff` trains the 2-2-1 toy network (models/toy.py) at the slider's learning
rate and shows one step of it with plots.py. Its status line is a contract with the browser
test: an HTML widget of class `smallem-status` reading, exactly,
`learning rate 0.5000 · final loss 0.50000 · dead units: 2/2`.
"""

from __future__ import annotations

import base64
import io
from typing import Any, Sequence

import ipywidgets as widgets
from matplotlib.figure import Figure

from .models.toy import CLIFF_STEPS, StepRecord, gradient_descent
from .plots import plot_step

STATUS_CLASS = "smallem-status"  # the browser test finds the status line by this class
SLIDER_CLASS = "smallem-lr"  # ... and the learning-rate slider by this one
FIGURE_CLASS = "smallem-figure"  # ... and the Output widget that holds the figure


def status_text(records: Sequence[StepRecord]) -> str:
    """The status line for one run: learning rate (4 decimals), loss after the last step
    (5 decimals), dead hidden units at the end out of 2."""
    last = records[-1]
    return (f"learning rate {last.lr:.4f} · final loss {last.loss:.5f} · "
            f"dead units: {last.dead_count}/2")


def _png_output(fig: Figure, alt: str) -> dict[str, Any]:
    """One output in the Output widget's own format: the figure as a PNG."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    return {"output_type": "display_data", "metadata": {},
            "data": {"image/png": base64.b64encode(buffer.getvalue()).decode("ascii"),
                     "text/plain": alt}}


class LearningRateCliff(widgets.VBox):
    """A learning-rate slider over the 2-2-1 network: every number of the chosen step on
    the network figure, the loss against step, and a one-line status.

    `lr_slider` is a FloatLogSlider from 0.01 to 1 (exponents −2 to 0) whose readout can be
    typed into (so 0.1 and 0.5 are exact); `step_slider` picks the step the figure shows;
    `status` is the HTML status line; `output` holds the figure; `records` the run."""

    def __init__(self, lr: float = 0.1, *, steps: int = CLIFF_STEPS, show_step: int = 3) -> None:
        self.steps = steps
        self.lr_slider = widgets.FloatLogSlider(
            value=lr, base=10, min=-2, max=0, step=0.001, description="learning rate",
            readout=True, readout_format=".4f",
            continuous_update=False,  # train and redraw once, on release, not per pixel
            style={"description_width": "110px"}, layout=widgets.Layout(width="560px"))
        self.lr_slider.add_class(SLIDER_CLASS)
        self.step_slider = widgets.IntSlider(
            value=min(show_step, steps), min=0, max=steps, description="show step",
            continuous_update=False, style={"description_width": "110px"},
            layout=widgets.Layout(width="560px"))
        self.status = widgets.HTML()
        self.status.add_class(STATUS_CLASS)
        self.output = widgets.Output()
        self.output.add_class(FIGURE_CLASS)
        self.records: list[StepRecord] = []
        self.figure: Figure | None = None
        hint = widgets.HTML(
            f"<i>Drag the learning rate, or click its number and type one (try 0.1, then 0.5); "
            f"each change trains {steps} steps of gradient descent.</i>")
        super().__init__(children=[hint, self.lr_slider, self.step_slider, self.status,
                                   self.output])
        self.lr_slider.observe(self._on_lr, names="value")
        self.step_slider.observe(self._on_step, names="value")
        self._on_lr()

    def _on_lr(self, change: dict | None = None) -> None:
        self.records = gradient_descent(float(self.lr_slider.value), self.steps)
        self.status.value = status_text(self.records)
        self._draw()

    def _on_step(self, change: dict | None = None) -> None:
        self._draw()

    def _draw(self) -> None:
        step = int(self.step_slider.value)
        record = self.records[step]
        # A pyplot-free Figure: redrawing from a callback never touches pyplot's figure list.
        self.figure = plot_step(self.records, step, Figure(figsize=(14.0, 4.9),
                                                           layout="constrained"))
        alt = (f"network at step {step}, learning rate {record.lr:.4f}: loss {record.loss:.5f}, "
               f"dead units {record.dead_count}/2")
        # Replace the outputs in one assignment: no flicker, and no kernel needed to do it.
        self.output.outputs = (_png_output(self.figure, alt),)

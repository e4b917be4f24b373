"""The notebooks' live views, as a kernel drives them: many slider events in a row (Home, then
ten quick ArrowRight presses) end on the last value, readout and picture together, with the view
never empty; the sliders' handles are named for screen readers; 05's dashboard starts at step 0
like the run's history, drawn at a legible dpi; a stored notebook's bar shows the finished run;
generated code keeps its indentation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import ipywidgets as widgets
import numpy as np
import pytest
from matplotlib.figure import Figure

from smallem import Tape
from smallem.course import AttentionView, LiveDashboard, LiveFigure, StepThrough, samples_html
from smallem.course.common.stepthrough import BackwardWalk
from smallem.course.common.widgets import LABELS_HTML, LIVE_FIGURE_CLASS

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"


def presses(slider: widgets.Widget, count: int = 10) -> list:
    """Home, then `count` ArrowRight presses, each as the frontend sends it: one value change."""
    values = [slider.min]
    slider.value = slider.min
    for _ in range(count):
        slider.value = min(slider.value + slider.step, slider.max)
        values.append(slider.value)
    return values


def watch(widget: widgets.Widget) -> list[str]:
    seen: list[str] = []
    widget.observe(lambda change: seen.append(change["new"]), names="value")
    return seen


def test_the_lambda_slider_ends_on_the_last_value_however_fast_the_presses():
    slider = widgets.FloatSlider(value=1.1, min=0.5, max=2.0, step=0.05, description="|λ| of Wₕₕ",
                                 readout_format=".2f")
    drawn: list[float] = []

    def draw(fig: Figure, radius: float) -> None:
        drawn.append(radius)
        fig.subplots().semilogy([1, 2, 3], [1.0, radius, radius ** 2])

    view = LiveFigure([slider], draw, note="the slider appears when the notebook runs")
    shown = watch(view.figure)
    values = presses(slider)
    assert LIVE_FIGURE_CLASS in view.figure._dom_classes
    assert shown and all(v.startswith("<img src=\"data:image/png;base64,") for v in shown)  # never empty
    last = re.search(r"data-values='([^']*)'", view.figure.value).group(1)
    assert json.loads(last.replace("&quot;", '"')) == [slider.value] == [values[-1]]
    assert f"|λ| of Wₕₕ = {slider.value:.2f}\"" in view.figure.value and drawn[-1] == slider.value
    assert f"{slider.value:.2f}" == "1.00"  # the readout, after Home and ten presses of 0.05
    bundle = view._repr_mimebundle_()
    stored = bundle[0] if isinstance(bundle, tuple) else bundle
    assert stored["text/plain"] == "the slider appears when the notebook runs"


def test_notebook_08_draws_its_slider_through_the_shared_view():
    cells = json.loads((NOTEBOOKS / "08_leaky_abstractions.ipynb").read_text())["cells"]
    code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "LiveFigure(" in code and "interactive_output" not in code and "widgets.Output" not in code


def walk() -> BackwardWalk:
    tape = Tape("cpu64")
    x = tape.leaf(np.linspace(-1, 1, 6))
    loss = tape.sum(tape.tanh(x * x + x))
    return BackwardWalk(tape, loss)


def test_the_step_through_ends_on_the_last_step_and_names_its_slider():
    view = StepThrough(walk(), point=0)
    shown = watch(view.view)
    values = presses(view.slider, 10)
    assert view.point == values[-1] == len(view.walk) and all(shown)
    assert f'data-point="{view.point}"' in view.view.value and view.view.value.endswith(LABELS_HTML)
    assert view.slider.description == "step" and "aria-label" in LABELS_HTML


def test_the_attention_view_ends_on_the_last_position_and_names_its_sliders():
    rng = np.random.default_rng(0)
    weights = np.tril(rng.random((1, 2, 12, 12)))
    weights /= weights.sum(-1, keepdims=True)
    view = AttentionView(np.arange(65, 77), weights, position=0)
    shown = watch(view.text)
    values = presses(view.position, 10)
    assert view.position.value == values[-1] == 10 and all(shown)
    assert "position 10 " in view.text.value and view.text.value.endswith(LABELS_HTML)
    assert {view.layer.description, view.head.description, view.position.description} == {
        "layer", "head", "position"}


def test_the_dashboard_starts_at_step_0_like_the_run_s_history(monkeypatch):
    import IPython.display

    from smallem.data import load_corpus
    from smallem.models import Mlp
    from smallem.training import TrainConfig, train

    class Handle:
        def update(self, obj):
            pass

    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=False: Handle())
    config = TrainConfig(backend="cpu", steps=20, batch=16, log_every=10, eval_every=10, eval_batches=1)
    dashboard = LiveDashboard(every=10, model=Mlp(), steps=config.steps, interval=0.0)
    corpus = load_corpus(max_bytes=200_000)
    result = train(config, corpus=corpus, observer=dashboard, log=None, progress=False)
    assert len(dashboard.monitor.losses) == len(result.history) == 3
    first = dashboard.monitor.losses[0]
    assert first["step"] == 0 and first["held_out_loss"] == result.history[0]["held_out_loss"]
    assert abs(first["held_out_loss"] - np.log(257)) < 0.05  # the check lesson 05 teaches first
    assert dashboard.dpi >= 100


def test_a_notebook_bar_leaves_its_finished_line(monkeypatch):
    import IPython.display

    from smallem.training import bar

    updates = []

    class Handle:
        def update(self, obj):
            updates.append(repr(obj))

    shown = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda obj, display_id=False: shown.append(obj) or Handle())
    from tqdm.notebook import tqdm as notebook_tqdm

    assert not isinstance(bar.progress_bar(range(2), disable=True), bar.kept_bar())  # a terminal's bar
    monkeypatch.setattr(bar, "tqdm", type("tqdm", (notebook_tqdm,), {}))  # tqdm.auto, as in a kernel
    for _ in bar.progress_bar(range(5), desc="the race", unit="step"):
        pass
    assert len(shown) == 1 and repr(shown[0]).startswith("the race: 100%")  # what a stored cell shows...
    assert len(updates) == 1 and "5/5" in updates[0] and "100%" in updates[0]  # ...once closed


def test_generated_code_is_left_aligned_with_its_indentation_kept():
    table = samples_html({"MLP": "\n        self.x = 1\n    <b>"}, prompt="    def __init__(self")
    assert table.count("text-align:left") == 2 and "white-space:pre-wrap" in table
    assert "    def __init__(self\n        self.x = 1\n    &lt;b&gt;" in table


@pytest.mark.parametrize("name", ["05_mlp", "09_backprop_by_hand"])
def test_the_notebooks_bars_are_the_package_s(name):
    cells = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())["cells"]
    code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "tqdm" not in code and "progress_bar(" in code

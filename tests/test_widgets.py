"""The learning-rate cliff widget, headless: it builds, and moving the slider updates the
status line that the browser test reads."""

import json
import re

import ipywidgets as widgets
import pytest

from smallem.course.common.widgets import (
    CLIFF_STEP_SLIDER_CLASS,
    FIGURE_CLASS,
    SLIDER_CLASS,
    STATUS_CLASS,
    LearningRateCliff,
    status_text,
)
from smallem.models import toy

STATUS = re.compile(r"^learning rate \d\.\d{4} · final loss \d\.\d{5} · dead units: [0-2]/2"
                    r"( · leaky slope [0-9.]+, [0-2]/2 units below zero)?$")


def drawn(cliff):
    """The alt text and the per-unit marks the figure's <img> carries."""
    alt = re.search(r'alt="([^"]*)"', cliff.figure.value).group(1)
    units = json.loads(re.search(r"data-units='([^']*)'", cliff.figure.value).group(1))
    return alt, {u["name"]: u for u in units}


@pytest.fixture(scope="module")
def cliff():
    return LearningRateCliff()


def test_builds_with_the_classes_the_browser_test_looks_for(cliff):
    assert isinstance(cliff, widgets.VBox)
    assert isinstance(cliff.lr_slider, widgets.FloatLogSlider)
    assert SLIDER_CLASS in cliff.lr_slider._dom_classes
    assert isinstance(cliff.status, widgets.HTML)
    assert STATUS_CLASS in cliff.status._dom_classes
    assert (cliff.lr_slider.base, cliff.lr_slider.min, cliff.lr_slider.max) == (10, -2, 0)
    assert cliff.lr_slider.continuous_update is False


def test_initial_status_at_0_1(cliff):
    cliff.lr_slider.value = 0.1
    assert cliff.status.value == "learning rate 0.1000 · final loss 0.00000 · dead units: 0/2"


def test_moving_the_slider_to_0_5_kills_both_units(cliff):
    cliff.lr_slider.value = 0.5
    assert cliff.status.value == "learning rate 0.5000 · final loss 0.50000 · dead units: 2/2"
    assert STATUS.match(cliff.status.value)
    cliff.lr_slider.value = 0.1
    assert cliff.status.value == "learning rate 0.1000 · final loss 0.00000 · dead units: 0/2"


def test_the_figure_shows_the_chosen_step_and_the_status_the_last(cliff):
    cliff.lr_slider.value = 0.5
    cliff.step_slider.value = 1
    assert 'src="data:image/png;base64,' in cliff.figure.value
    alt, units = drawn(cliff)
    assert "step 1" in alt and "dead units 1/2" in alt
    # h2 dies at step 1 (seed article 002): hatched and grey; h1 still alive
    assert units["h₂"]["hatch"] == "///" and units["h₁"]["hatch"] == ""
    # ... while the status line reports the run's last step, not the one shown
    assert cliff.status.value == "learning rate 0.5000 · final loss 0.50000 · dead units: 2/2"
    cliff.step_slider.value = 3
    assert {u["hatch"] for n, u in drawn(cliff)[1].items() if n.startswith("h")} == {"///"}
    assert FIGURE_CLASS in cliff.figure._dom_classes
    assert CLIFF_STEP_SLIDER_CLASS in cliff.step_slider._dom_classes


def test_keyboard_steps_cross_the_range_in_a_few_dozen_presses(cliff):
    presses = (cliff.lr_slider.max - cliff.lr_slider.min) / cliff.lr_slider.step
    assert 20 <= presses <= 60


def test_leaky_units_recover_where_relu_units_die():
    leaky = LearningRateCliff(lr=0.5, show_step=20, slope=0.1)
    assert leaky.status.value.startswith("learning rate 0.5000 · final loss ")
    assert "dead units: 0/2" in leaky.status.value and STATUS.match(leaky.status.value)
    leaky.slope.value = 0.0
    assert leaky.status.value == "learning rate 0.5000 · final loss 0.50000 · dead units: 2/2"


def test_a_stored_notebook_says_the_truth_not_a_repr(cliff):
    bundle = cliff._repr_mimebundle_()
    assert "LearningRateCliff(" not in bundle["text/plain"]
    assert "appears here when the notebook runs" in bundle["text/html"]


def test_every_slider_position_gives_a_well_formed_status():
    for lr in (0.01, 0.0123, 0.35, 0.494, 0.999, 1.0):
        assert STATUS.match(status_text(toy.gradient_descent(lr)))


def test_the_ends_of_the_slider_work():
    cliff = LearningRateCliff(lr=0.01, steps=5)
    assert cliff.status.value.startswith("learning rate 0.0100 ·")
    cliff.lr_slider.value = 1.0
    assert cliff.status.value == "learning rate 1.0000 · final loss 0.50000 · dead units: 2/2"

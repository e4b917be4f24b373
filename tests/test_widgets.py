"""The learning-rate cliff widget, headless: it builds, and moving the slider updates the
status line that the browser test reads."""

import re

import ipywidgets as widgets
import pytest

from smallem.widgets import SLIDER_CLASS, STATUS_CLASS, LearningRateCliff, status_text
from smallem.models import toy

STATUS = re.compile(r"^learning rate \d\.\d{4} · final loss \d\.\d{5} · dead units: [0-2]/2$")


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


def test_the_output_shows_the_chosen_step(cliff):
    cliff.lr_slider.value = 0.5
    cliff.step_slider.value = 1
    (shown,) = cliff.output.outputs
    assert shown["data"]["image/png"]
    assert "step 1" in shown["data"]["text/plain"]
    assert "dead units 1/2" in shown["data"]["text/plain"]


def test_every_slider_position_gives_a_well_formed_status():
    for lr in (0.01, 0.0123, 0.35, 0.494, 0.999, 1.0):
        assert STATUS.match(status_text(toy.gradient_descent(lr)))


def test_the_ends_of_the_slider_work():
    cliff = LearningRateCliff(lr=0.01, steps=5)
    assert cliff.status.value.startswith("learning rate 0.0100 ·")
    cliff.lr_slider.value = 1.0
    assert cliff.status.value == "learning rate 1.0000 · final loss 0.50000 · dead units: 2/2"

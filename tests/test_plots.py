"""The matplotlib views: each returns Axes whose text artists carry the numbers shown."""

import matplotlib

matplotlib.use("Agg")  # headless: tests never open a window

import matplotlib.pyplot as plt
import numpy as np
import pytest

from smallem.course import plots
from smallem.models import toy


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def texts(ax) -> str:
    """Every piece of text drawn on `ax`, title included, with ASCII minus signs."""
    shown = [ax.get_title()] + [t.get_text() for t in ax.texts]
    return "\n".join(shown).replace("\u2212", "-")


def test_network_figure_carries_every_number_of_the_seed():
    ax = plots.draw_network(toy.forward_backward())
    shown = texts(ax)
    for number in ("0.7", "-0.15", "0.66125", "-1.15", "-0.805", "-0.575", "0.575", "1.15",
                   "= 0.1", "= 0.3", "= 0.2", "= 0.4", "= 0.5", "= -0.5"):
        assert number in shown, number
    assert "DEAD" not in shown
    assert isinstance(ax.figure, matplotlib.figure.Figure)


def test_dead_units_are_marked():
    records = toy.gradient_descent(0.5, steps=3)
    one = texts(plots.draw_network(records[1]))
    both = texts(plots.draw_network(records[3]))
    assert one.count("DEAD") == 1 and both.count("DEAD") == 2
    assert "dead units 2/2" in both and "loss 0.5" in both


def test_draws_on_a_given_axes():
    fig, ax = plt.subplots()
    assert plots.draw_network(toy.forward_backward(), ax=ax) is ax


def test_loss_plot_has_one_point_per_step():
    records = toy.gradient_descent(0.5, steps=5)
    ax = plots.plot_loss(records, highlight=3)
    line = ax.lines[0]
    np.testing.assert_allclose(line.get_xdata(), range(6))
    np.testing.assert_allclose(line.get_ydata(), [r.loss for r in records])


def test_cliff_plot_uses_a_log_axis_and_marks_the_edge():
    scan = toy.scan_learning_rates(np.logspace(-2, 0, 21))
    ax = plots.plot_cliff(scan, cliff=0.494)
    assert ax.get_xscale() == "log"
    assert "cliff ≈ 0.494" in texts(ax)


def test_plot_curves_takes_pairs_and_bare_losses():
    ax = plots.plot_curves({"MLP": ([0, 10, 20], [5.5, 3.0, 2.5]), "bigram": [5.5, 4.0, 3.5]},
                           smooth=1, hline={"ln 257": 5.549}, title="training")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["MLP", "bigram"]
    np.testing.assert_allclose(ax.lines[0].get_xdata(), [0, 10, 20])
    np.testing.assert_allclose(ax.lines[1].get_xdata(), [0, 1, 2])
    assert "ln 257" in texts(ax)


def test_plot_curves_smooths_with_a_moving_average():
    ax = plots.plot_curves({"noisy": (np.arange(10), np.arange(10.0))}, smooth=4)
    raw, smooth = ax.lines[:2]
    np.testing.assert_allclose(smooth.get_ydata(), np.arange(1.5, 8.0))
    assert ax.get_legend().get_texts()[0].get_text() == "noisy"


def test_plot_step_draws_the_network_beside_the_loss():
    from matplotlib.figure import Figure

    records = toy.gradient_descent(0.5, steps=4)
    fig = plots.plot_step(records, 3, Figure())
    network, loss = fig.axes
    assert "dead units 2/2" in texts(network)
    assert len(loss.lines[0].get_xdata()) == 5


def test_plot_curves_marks_the_points_of_the_named_curves():
    ax = plots.plot_curves({"train": [3.0, 2.0, 1.5], "held-out": ([0, 100], [3.1, 2.2])},
                           markers=["held-out"])
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert lines["held-out"].get_marker() == "o" and lines["train"].get_marker() in ("None", "", None)

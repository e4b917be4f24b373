"""What the notebooks look through: the dashboard of training health (the monitor itself is a
training observer, smallem.training.health, re-exported here), plots of the small
networks, the learning-rate widget, the step-through walk of a backward pass, and the race of a
hand-written backward against the tape, and what attention heads look at (lessons 11-12: the
trained model's too).
Nothing in the library imports these."""

from ..training.bar import progress_bar  # notebooks' own loops show the bar train() shows
from ..training.health import HealthMonitor, dead_fraction, dead_units
from . import attention, byhand, dashboard, heads, plots
from .attention import (
                        AttentionView,
                        OneHeadLM,
                        attention_weights,
                        losses_at,
                        opener_distances,
                        recorded_curve,
                        recorded_run,
                        render_html,
                        samples_html,
                        strongest,
)
from .dashboard import LiveDashboard
from .heads import closing_windows, plot_head_maps, weight_on, weights_of
from .recordings import recorded, trained
from .stepthrough import BackwardWalk, StepThrough
from .widgets import LearningRateCliff, LiveFigure

__all__ = [
    "AttentionView", "OneHeadLM", "attention_weights", "losses_at", "opener_distances",
    "recorded_curve", "recorded_run", "render_html", "samples_html", "strongest", "recorded", "trained",
    "closing_windows", "plot_head_maps", "weight_on", "weights_of", "heads",
    "progress_bar", "attention", "byhand", "dashboard", "plots", "LiveDashboard", "HealthMonitor",
    "BackwardWalk", "StepThrough", "LearningRateCliff", "LiveFigure", "dead_fraction", "dead_units",
]

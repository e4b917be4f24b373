"""Lesson 05's live dashboard draws within its budget of wall time (a frame of six panels costs
seconds: the cell once spent 57 of its 95 s redrawing), and always draws the last frame, from
every record."""

from __future__ import annotations

import IPython.display

from smallem.course.common import dashboard as dash


class Monitor:
    """What LiveDashboard reads of a HealthMonitor, records appended by hand."""

    def __init__(self) -> None:
        self.records, self.losses = [], []

    def on_record(self, record) -> None:
        self.losses.append(record)

    def rate(self) -> None:
        return None

    def restart(self) -> None:
        self.records, self.losses = [], []


def run(monkeypatch, budget: float, frame: float = 2.0, step_time: float = 0.5, steps: int = 100):
    """`steps` records, each after step_time s of training, each frame costing `frame` s:
    (frames drawn, seconds drawing, seconds in all, records the last frame showed)."""
    clock = [0.0]
    shown = []
    monkeypatch.setattr(dash.time, "perf_counter", lambda: clock[0])

    def draw(fig, records, losses, **kw):
        clock[0] += frame
        shown.append(len(records))

    class Handle:
        def update(self, obj) -> None:
            pass

    monkeypatch.setattr(dash, "draw", draw)
    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=False: Handle())
    monitor = Monitor()
    live = dash.LiveDashboard(steps=steps, interval=0.0, budget=budget, monitor=monitor, dpi=10)
    for step in range(1, steps + 1):
        clock[0] += step_time
        monitor.records.append({"step": step})
        live.on_record({"step": step})
    return live.redraws, frame * len(shown), clock[0], shown[-1]


def test_the_dashboard_draws_within_its_budget_and_draws_the_last_frame(monkeypatch):
    frames, drawing, total, last = run(monkeypatch, budget=0.1)
    assert last == 100  # the final figure: every record
    assert drawing <= 0.1 * total + 2 * 2.0, (frames, drawing, total)  # the budget, and the last frame
    unbounded = run(monkeypatch, budget=1.0)  # no budget: a frame for every record
    assert unbounded[0] == 100 and frames < unbounded[0] / 5

"""The progress bar of every long loop (training, the capstone's race), and the training loop's
clock (`Clock`: its bar, log lines, and the time spent evaluating): tqdm's, where a notebook's
bar, a widget, also leaves its final line. A stored notebook keeps no widget state, so it shows the
text the widget was first displayed with (`0%| | 0/2000`); here the display is updated when the bar
closes, and the stored text is the finished bar."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import cache
from typing import Any

from tqdm.auto import tqdm


def progress_bar(iterable: Any = None, **kwargs: Any) -> tqdm:
    """`tqdm.auto.tqdm(iterable, **kwargs)`, whose notebook widget is displayed under a display id
    and replaced, once closed, by itself with its final text (what a stored notebook shows)."""
    notebook = sys.modules.get("tqdm.notebook")  # imported by tqdm.auto only inside a Jupyter kernel
    if notebook is None or not issubclass(tqdm, notebook.tqdm):  # a terminal's bar: nothing is stored
        return tqdm(iterable, **kwargs)
    return kept_bar()(iterable, **kwargs)


def terminal_only() -> bool:
    """Whether bars go to a terminal (not a notebook's widgets): a transient bar (leave=False)
    is shown only there, as a stored notebook would keep its first text ("0%") for good."""
    notebook = sys.modules.get("tqdm.notebook")
    return notebook is None or not issubclass(tqdm, notebook.tqdm)


@cache
def kept_bar() -> type:
    """The notebook bar shown through a display handle and updated on close (its class is made
    on first use: tqdm.notebook imports ipywidgets, which a terminal run never needs)."""
    from tqdm.notebook import tqdm as notebook_tqdm

    class KeptBar(notebook_tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            from IPython.display import display

            self._handle = None
            super().__init__(*args, **{**kwargs, "display": False})
            if not self.disable:
                self._handle = display(self.container, display_id=True)
                self.displayed = True

        def close(self) -> None:
            super().close()
            handle, self._handle = getattr(self, "_handle", None), None
            if handle is not None and self.leave:  # its text/plain now reads 100%, n/n, the time
                handle.update(self.container)

    return KeptBar


class Clock:
    """The loop's clock and voice: a tqdm bar, log lines, and the time spent evaluating (which
    is not training time, so steps/s leaves it out)."""

    def __init__(self, config: Any, step: int, offset: float, show: bool,
                 log: Callable[[str], Any] | None) -> None:
        self.bar = progress_bar(total=config.steps, initial=step, disable=not show, unit="step",
                                dynamic_ncols=True)
        self.say = self.bar.write if show and log is print else log
        self.offset = offset  # seconds of the run before this session (a resumed run)
        self.start = self.last_time = time.perf_counter()
        self.first_step = self.last_step = step
        self.evaluating = 0.0

    def seconds(self) -> float:
        """Seconds since the run began, sessions before this one included."""
        return self.offset + time.perf_counter() - self.start

    def rate(self, step: int) -> float:
        """Steps per second since the last log line."""
        return (step - self.last_step) / max(time.perf_counter() - self.last_time, 1e-9)

    def logged(self, step: int, began: float) -> None:
        """A log point that began at `began` is over: its time was not training."""
        self.last_step, self.last_time = step, time.perf_counter()
        self.evaluating += self.last_time - began

    def steps_per_second(self, step: int) -> float:
        done = step - self.first_step
        return done / max(time.perf_counter() - self.start - self.evaluating, 1e-9) if done else 0.0

"""The progress bar of every long loop (training, the capstone's race): tqdm's, where a notebook's
bar, a widget, also leaves its final line. A stored notebook keeps no widget state, so it shows the
text the widget was first displayed with (`0%| | 0/2000`); here the display is updated when the bar
closes, and the stored text is the finished bar."""

from __future__ import annotations

import sys
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

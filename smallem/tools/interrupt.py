"""The SIGINT handler of the `smallem` command while it loads (start.py installs it, cli.py
replaces it by Python's own once the command is loaded): one line and the process ends.
"""

from __future__ import annotations

import os
from types import FrameType


def quit_at_once(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C while the command loads: nothing is written yet, nothing to save. (Pressed inside
    a C extension's import, a KeyboardInterrupt can come out as an ImportError with a traceback.)"""
    os.write(2, b"smallem: interrupted\n")
    os._exit(128 + signum)

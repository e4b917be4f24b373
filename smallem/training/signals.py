"""Stopping a run cleanly: Ctrl-C (SIGINT) and SIGTERM are deferred to the end of the step under
way, so training/loop.py saves an exact checkpoint before it raises `Interrupted`; a second
signal stops at once.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Interrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C (SIGINT) or SIGTERM between two steps; the message says what
    was saved. `signum` gives the command line its exit status (128 + signum)."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.signum = signum


class Interrupt:
    """Whether a stop was asked for, and by which signal."""

    requested = False
    signum = signal.SIGINT


@contextmanager
def deferred_interrupt() -> Iterator[Interrupt]:
    """Ctrl-C, and SIGTERM (what `kill`, Docker and Slurm send), stop the loop between two
    steps, never inside an update, so the checkpoint saved then is exact. A second one stops
    at once."""
    flag = Interrupt()

    def handler(signum: int, frame: Any) -> None:
        if flag.requested:
            raise Interrupted(f"stopped by {signal.Signals(signum).name} a second time, at "
                              "once", signum)
        flag.requested, flag.signum = True, signum

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[signum] = signal.signal(signum, handler)
        except ValueError:  # not the main thread: leave the signals as they are
            pass
    try:
        yield flag
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)

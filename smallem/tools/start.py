"""Where the `smallem` command starts (the console script and `python -m smallem`): a Ctrl-C
while Python loads the package's modules ends the process with one line at once. Pressed inside
a C extension's import (NumPy, ml_dtypes), a KeyboardInterrupt can come out as an ImportError
with a traceback; cli.py hands Ctrl-C back to Python once the imports are done.
"""

from __future__ import annotations

import signal
import sys

from .interrupt import quit_at_once


def main() -> int:
    try:
        signal.signal(signal.SIGINT, quit_at_once)
    except ValueError:  # not the main thread: leave Ctrl-C as it is
        pass
    from .cli import main as run

    return run()


if __name__ == "__main__":
    sys.exit(main())

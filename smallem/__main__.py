"""`python -m smallem` is the same as the `smallem` command."""

import sys

from .tools.cli import main

sys.exit(main())

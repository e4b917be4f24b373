"""`python -m smallem` is the same as the `smallem` command."""

import sys

from .cli import main

sys.exit(main())

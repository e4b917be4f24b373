"""`python -m smallem` is the same as the `smallem` command."""

import sys

from .tools.start import main

sys.exit(main())

"""The float32 CPU's engine: the CPU's twin of backends/cuda/. How many threads run (threads.py),
the team that runs them (team.py), malloc told to keep its pages (memory.py), and the products
and updates split over the team (products.py). numpy.py's float32 backend uses it; cpu64, the
reference rules and the lessons stay plain NumPy. Why this route: README.md beside this file.
"""

from .memory import keep_pages, minor_faults
from .threads import decide, settle, team_size

__all__ = ["decide", "settle", "team_size", "keep_pages", "minor_faults"]

"""One rank of `ranks.run`: `python -m smallem.ranks.worker IN OUT` under mpiexec reads the function
and its arguments from IN, calls function(world, *args), and rank 0 writes every rank's return
value (or the first error) to OUT, atomically.
"""

from __future__ import annotations

import importlib
import pickle
import sys

from ..files import atomic_write
from .world import world


def main(inputs: str, outputs: str) -> int:
    function, args = pickle.loads(open(inputs, "rb").read())  # noqa: S301 - written by ranks.run
    module, name = function.split(":")
    here = world()
    try:
        value: object = (True, getattr(importlib.import_module(module), name)(here, *args))
    except Exception as error:  # every rank says how it failed; rank 0 raises the first
        value = (False, error)
    everyone = here.allgather(value)
    if here.rank == 0:
        failed = [v for ok, v in everyone if not ok]
        result = failed[0] if failed else [v for _, v in everyone]
        atomic_write(outputs, lambda f: f.write(pickle.dumps(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

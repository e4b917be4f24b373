"""The fused table's passes compiled with numba (the optional extra `smallem[fast]`): each of
GELU, LayerNorm and cross-entropy as one loop over a block of rows that releases the GIL for the
whole block, where numpy_fused.py makes 6-10 NumPy calls a block. The team (team.py) runs them on
the same blocks as the NumPy route, so the bits do not depend on the thread count either; the NumPy
kernels stay the reference they are tested against (tests/test_cpu_compiled.py).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from ...errors import SmallemError

ENV = "SMALLEM_KERNELS"  # "numba", "numba-table" (attention on NumPy), "numpy", or unset: DEFAULT
ROUTES = ("numba", "numba-table", "numpy")
DEFAULT = "numba"  # when ENV is unset and numba is installed (README.md beside this file says why)

_kernels: Any = None  # None: not tried yet; False: the NumPy route


def route() -> str:
    """One of ROUTES: the kernels the fused table (and attention) run now."""
    return (os.environ.get(ENV, "").strip().lower() or DEFAULT) if kernels() else "numpy"


def attention() -> Any:
    """The compiled kernels when the attention runs compiled too ('numba'), else False."""
    return kernels() if route() == "numba" else False


def kernels() -> Any:
    """The compiled kernels (a namespace), or False for the NumPy route: SMALLEM_KERNELS, else
    DEFAULT where numba is installed. Asking for numba where it is missing is one sentence."""
    global _kernels
    raw = os.environ.get(ENV, "").strip().lower()
    if raw not in ("",) + ROUTES:
        raise SmallemError(f"{ENV}={raw!r}: give one of {', '.join(ROUTES)} (or unset it to let "
                           "smallem choose)")
    if (raw or DEFAULT) == "numpy":
        return False
    if _kernels is None:
        try:
            from . import compiled_kernels
        except ImportError:
            _kernels = False
        else:
            _kernels = SimpleNamespace(**compiled_kernels.ALL)
    if raw.startswith("numba") and not _kernels:
        raise SmallemError(f"{ENV}={raw}, but numba is not installed: pip install 'smallem[fast]' "
                           "(or unset it for the NumPy route)")
    return _kernels

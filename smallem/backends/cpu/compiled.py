"""The fused table's passes compiled with numba (the optional extra `smallem[fast]`): each of
GELU, LayerNorm and cross-entropy as one loop over a block of rows that releases the GIL for the
whole block, where numpy_fused.py makes 6-10 NumPy calls a block. The team (team.py) runs them on
the same blocks as the NumPy route, so the bits do not depend on the thread count either; the NumPy
kernels stay the reference they are tested against (tests/test_cpu_compiled.py).
"""

from __future__ import annotations

import os
import warnings
from types import SimpleNamespace
from typing import Any

from ...errors import SmallemError, SmallemWarning

ENV = "SMALLEM_KERNELS"  # "numba", "numba-table" (attention on NumPy), "numpy", or unset: DEFAULT
ROUTES = ("numba", "numba-table", "numpy")
DEFAULT = "numba"  # when ENV is unset and numba is installed (README.md beside this file says why)

_kernels: Any = None  # None: not tried yet; False: the NumPy route
_why = [""]  # why the compiled kernels are not there, once tried
# A read-only install and a read-only home (a container, a shared cluster): numba refuses to
# compile functions it was asked to cache, where it finds no folder to write them to.
UNCACHED = ("numba finds no writable folder for its compiled kernels (set NUMBA_CACHE_DIR to "
            "one)")


def route() -> str:
    """One of ROUTES: the kernels the fused table (and attention) run now."""
    return (os.environ.get(ENV, "").strip().lower() or DEFAULT) if kernels() else "numpy"


def attention() -> Any:
    """The compiled kernels when the attention runs compiled too ('numba'), else False."""
    return kernels() if route() == "numba" else False


_blas: list[Any] = []  # [] not tried yet; [False] or [compiled_attention's namespace]


def attention_blas() -> Any:
    """compiled_attention's kernels (the attention's products as calls of NumPy's OpenBLAS from
    the compiled block) when the attention runs compiled and that OpenBLAS can be called
    (compiled_linear's sgemm); else False: compiled_kernels' own loops run the attention."""
    if not attention():
        return False
    if not _blas:
        try:
            from . import compiled_attention
        except ImportError:  # another BLAS (Accelerate, MKL, an LP64 OpenBLAS)
            _blas.append(False)
        else:
            _blas.append(SimpleNamespace(**compiled_attention.ALL))
    return _blas[0]


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
            from . import compiled_kernels, compiled_passes
        except ImportError:
            _kernels, why = False, "numba is not installed: pip install 'smallem[fast]'"
        except RuntimeError as error:  # numba: "cannot cache function …: no locator available"
            if "cache" not in str(error):
                raise
            _kernels, why = False, UNCACHED
            if not raw.startswith("numba"):
                warnings.warn(UNCACHED + ": the NumPy route runs instead", SmallemWarning,
                              stacklevel=2)
        else:
            _kernels, why = SimpleNamespace(**compiled_kernels.ALL, **compiled_passes.ALL), ""
        _why[0] = why
    if raw.startswith("numba") and not _kernels:
        raise SmallemError(f"{ENV}={raw}, but {_why[0]} (or unset it for the NumPy route)")
    return _kernels


LINEAR_ENV = "SMALLEM_LINEAR"  # "numba" (each thread's pieces in one compiled call) or "numpy"
LINEAR_DEFAULT = "numba"  # faster at 16, 2 and 1 threads on the 16-core host (round9/cpu2.md)
_linear: list[Any] = []  # [] not tried yet; [False] or [the kernels' namespace]


def linear() -> Any:
    """compiled_linear's kernels (a Linear's pieces calling NumPy's OpenBLAS without the GIL)
    when numba's route runs, NumPy's BLAS is an OpenBLAS they can call, and SMALLEM_LINEAR is not
    'numpy'; else False (linear.py's NumPy calls: the same bits)."""
    raw = os.environ.get(LINEAR_ENV, "").strip().lower() or LINEAR_DEFAULT
    if raw not in ("numba", "numpy"):
        raise SmallemError(f"{LINEAR_ENV}={raw!r}: give numba or numpy (or unset it to let "
                           "smallem choose)")
    if raw == "numpy" or not kernels():
        return False
    if not _linear:
        try:
            from . import compiled_linear
        except ImportError:  # another BLAS (Accelerate, MKL, an LP64 OpenBLAS): NumPy's calls
            _linear.append(False)
        else:
            _linear.append(SimpleNamespace(**compiled_linear.ALL))
    return _linear[0]

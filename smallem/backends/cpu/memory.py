"""malloc told to keep the pages of the float32 step's temporaries (glibc on Linux), and the minor
page faults a process has taken, which `smallem bench` reports per step for every CPU row.
Elsewhere (macOS, Windows, musl) keep_pages does nothing: their allocators are left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc's malloc.h: free() returns the heap's top to the system past this
M_MMAP_THRESHOLD = -3  # allocations from this size up get pages of their own, unmapped on free
MMAP_AT = 256 << 20  # a step's largest temporary is 16 MB (the attention scores' rule): all heap
TRIM_AT = 512 << 20

_kept: bool | None = None  # None: not tried yet


def keep_pages() -> bool:
    """Once per process: have glibc serve every array under 256 MiB from its heap and keep up to
    512 MiB of freed heap. Otherwise glibc's sliding mmap threshold can leave a step's 4-16 MB
    temporaries on fresh mmapped pages, each zeroed by the kernel on first touch: ~27,000 minor
    faults and twice the CPU time a step, in processes chosen by the history of their frees
    (issue 38). True when the thresholds were set (Linux with glibc), False elsewhere."""
    global _kept
    if _kept is None:
        _kept = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                mallopt = libc.mallopt  # glibc's; musl has none and lands in except
                mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
                # a glibc that caps the threshold at 32 MiB (its default maximum) refuses more
                mapped = mallopt(M_MMAP_THRESHOLD, MMAP_AT) or mallopt(M_MMAP_THRESHOLD, 32 << 20)
                _kept = bool(mapped) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_AT))
            except (OSError, AttributeError):
                _kept = False
    return _kept


def minor_faults() -> int | None:
    """Minor page faults this process has taken so far (None where getrusage is missing)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

"""Where numba keeps the compiled engine's machine code (imported by every compiled*.py module
before its first `cache=True` kernel). numba keys a cached function on its own source file only:
a kernel that inlines a helper or reads a constant of another module (compiled_attention's `_exp`
from compiled_kernels, GELU's constants from backends/array.py) kept its old machine code after
that module changed, silently (round 12). Here every cached kernel of this folder lives in a
subfolder named by a hash of all compiled*.py files and backends/array.py, so a change to any of
them compiles afresh; the subfolder sits where numba would have put the cache (NUMBA_CACHE_DIR,
else __pycache__ beside the file, else the user's cache folder). Functions of other packages keep
numba's own locators (ours answer None for them). NUMBA_CACHE_LOCATOR_CLASSES, where a user sets
it, replaces the list and this with it. Each change leaves the old subfolder behind (a few MB):
the first locator of a process removes its siblings that nothing has written to for STALE
seconds (a day), never its own, so that a process still running the old sources (it writes its
cache when it compiles a new signature) keeps its folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from pathlib import Path

from numba.core import caching

HERE = Path(__file__).resolve().parent
KEYED = (*sorted(HERE.glob("compiled*.py")), HERE.parent / "array.py")  # what the kernels read


def digest(files: tuple[Path, ...] = KEYED) -> str:
    """A short hash of the files' contents (their names too: a file added or removed counts)."""
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


FOLDER = f"smallem-{digest()}"
STALE = 24 * 3600.0  # seconds since an old subfolder's last write before it is removed
NAMED = re.compile(r"smallem-[0-9a-f]{16}")  # digest()'s subfolders: nothing else is touched
_swept: set[str] = set()  # parents already swept by this process


def _last_write(folder: Path) -> float:
    """The newest modification time of the folder and the files in it."""
    times = [folder.stat().st_mtime]
    times += [f.stat().st_mtime for f in folder.iterdir()]
    return max(times)


def sweep(parent: str | Path, now: float | None = None) -> list[str]:
    """Remove parent's smallem-<digest> subfolders other than FOLDER that nothing has written to
    for STALE seconds; their names, sorted. Anything unreadable or that fails to go is left."""
    now = time.time() if now is None else now
    gone = []
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return gone
    for entry in entries:
        if entry.name == FOLDER or not NAMED.fullmatch(entry.name) or entry.is_symlink():
            continue
        try:
            if not entry.is_dir() or now - _last_write(entry) < STALE:
                continue
        except OSError:  # removed meanwhile by another process's sweep
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            gone.append(entry.name)
    return sorted(gone)


def _keyed(locator: type) -> type:
    """numba's `locator` for this folder's files only, its cache one subfolder further down."""

    class Keyed(locator):  # type: ignore[misc, valid-type]
        def __init__(self, py_func, py_file):
            super().__init__(py_func, py_file)
            if self._cache_path not in _swept:  # once a folder a process
                _swept.add(self._cache_path)
                sweep(self._cache_path)
            self._cache_path = os.path.join(self._cache_path, FOLDER)

        @classmethod
        def from_function(cls, py_func, py_file):
            if Path(py_file).resolve().parent != HERE:
                return None
            return super().from_function(py_func, py_file)

    Keyed.__name__ = Keyed.__qualname__ = f"Smallem{locator.__name__}"
    return Keyed


def install() -> None:
    """Put the keyed locators first in numba's list, once a process."""
    def named(name: str) -> type:  # numba before 0.61 spells its classes with a leading "_"
        return getattr(caching, name, None) or getattr(caching, "_" + name)

    impl = named("CacheImpl")
    if not any(c.__name__.startswith("Smallem") for c in impl._locator_classes):
        ours = [_keyed(named(n)) for n in ("UserProvidedCacheLocator", "InTreeCacheLocator",
                                          "UserWideCacheLocator")]
        impl._locator_classes = ours + list(impl._locator_classes)


install()

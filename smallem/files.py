"""Output files, for every room that writes one (training's checkpoints, the tools' results and
figures, the exercises' progress): written atomically, and checked before the work starts by
the very code that writes them (it creates and removes the temporary file a save
would use), so a path that cannot be written fails in the first second, not after the run.

A save writes a temporary file beside the destination, syncs it, renames it over the
destination and syncs the folder: a reader, or a crash, sees the old file or the new one. A
symbolic link is written through (the file it points to is replaced, the link stays); a device,
pipe or socket is never replaced.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from .errors import SmallemError

TEMP_SUFFIX = ".tmp"
NAME_IN_TEMP = 32  # characters of the destination's name kept in its temp file's name

_KINDS = {stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
          stat.S_ISFIFO: "a named pipe", stat.S_ISSOCK: "a socket"}


def not_a_file(path: str | os.PathLike) -> str | None:
    """What `path` is when it exists and is no regular file ("a named pipe", "a folder", ...), so
    that a reader refuses it before opening (a pipe's read waits forever, /dev/zero never ends);
    None for a regular file or a missing path (its reader says that)."""
    try:
        mode = os.stat(_expand(path)).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    return next((name for test, name in _KINDS.items() if test(mode)), "not a regular file")


def look_up(path: str | os.PathLike, what: str, fix: str) -> str | None:
    """What a reader finds at `path` before opening it: None for a regular file, "missing", or
    not_a_file's kind ("a folder", "a named pipe", ...). A path that cannot even be looked up (a
    name too long: Python 3.11's exists() raises it) is one sentence naming `what`, then `fix`."""
    try:
        mode = os.stat(_expand(path)).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as error:
        shown = repr(str(path)) if len(str(path)) < 200 else f"path of {len(str(path)):,} characters"
        raise SmallemError(f"{what} {shown} cannot be looked up: {(error.strerror or str(error)).lower()}; "
                           f"{fix}") from None
    return None if stat.S_ISREG(mode) else not_a_file(path)


def _expand(path: str | os.PathLike) -> Path:
    return Path(os.path.expanduser(os.fspath(path)))


def _fail(what: str, path: Any, reason: str) -> SmallemError:
    return SmallemError(f"cannot write {what} {str(path)!r}: {reason}")


def destination(path: str | os.PathLike, what: str = "file") -> Path:
    """Where writing `path` lands: `~` expanded and links followed. Refuses a folder and
    anything that is not a regular file (a device, a pipe, a socket), and a missing folder."""
    given = _expand(path)
    target = Path(os.path.realpath(given))
    try:
        mode = os.stat(given).st_mode  # through links, /proc's magic ones (/dev/stdout) too
    except FileNotFoundError:
        mode = None
    except NotADirectoryError:
        raise _fail(what, path, f"{str(given.parent)!r} is not a folder; name a file in a "
                                "folder") from None
    except OSError as error:  # a loop of links, a name too long...
        raise _fail(what, path, _reason(error, given.parent)) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise SmallemError(f"{what} {str(path)!r} is a folder: name a file in it")
    if mode is not None and not stat.S_ISREG(mode):
        kind = next(name for test, name in _KINDS.items() if test(mode))
        via = f" (through a link to {str(target)!r})" if target != Path(os.path.abspath(given)) else ""
        raise _fail(what, path, f"{str(path)!r} is {kind}, not a regular file{via}; smallem "
                                "saves by replacing a file, so name a regular file")
    folder = target.parent
    if not folder.is_dir():
        shown = given.parent if not folder.exists() else folder
        if folder.exists():
            raise _fail(what, path, f"{str(folder)!r} is not a folder; name a file in a folder")
        raise _fail(what, path, f"folder {str(shown)!r} does not exist; create it first")
    return target


def _temp_prefix(target: Path) -> str:
    """`.NAME.CRC.PID.`: short whatever the name's length, unique to the destination, and
    naming the process, so a later save can tell a killed save's leftover from a live one."""
    tag = zlib.crc32(os.fsencode(target.name))
    return f".{target.name[:NAME_IN_TEMP]}.{tag:08x}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove the temporary files that saves to `target` by processes now gone left behind
    (a save killed between creating its temporary file and renaming it)."""
    prefix, removed = _temp_prefix(target), []
    try:
        names = os.listdir(target.parent)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(TEMP_SUFFIX)):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                os.unlink(target.parent / name)
                removed.append(target.parent / name)
            except OSError:
                pass
    return removed


def _reason(error: OSError, folder: Path) -> str:
    code = error.errno
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied in folder {str(folder)!r}; choose a folder you can write to"
    if code == errno.EROFS:
        return f"folder {str(folder)!r} is on a read-only file system; choose another folder"
    if code == errno.ENAMETOOLONG:
        return "the name is too long for the file system (most allow 255 bytes); shorten it"
    if code == errno.ENOSPC:
        return f"no space left in folder {str(folder)!r}; free some or choose another folder"
    if code == errno.ENOENT and folder.is_dir():
        return (f"cannot create files in folder {str(folder)!r} (a system folder?); choose "
                "another folder")
    if code == errno.ENOTDIR:
        return f"a part of {str(folder)!r} is not a folder; name a file in a folder"
    return f"{error.strerror or error} in folder {str(folder)!r}; choose another place"


def _open_temp(target: Path, what: str, path: Any) -> tuple[int, str]:
    if len(os.fsencode(target.name)) > 255:
        raise _fail(what, path, _reason(OSError(errno.ENAMETOOLONG, ""), target.parent))
    try:
        return tempfile.mkstemp(dir=target.parent, suffix=TEMP_SUFFIX,
                                prefix=f"{_temp_prefix(target)}{os.getpid()}.")
    except OSError as error:
        raise _fail(what, path, _reason(error, target.parent)) from None


def check_writable(path: str | os.PathLike, what: str = "file") -> Path:
    """Refuse now what a save to `path` would fail on later: create and remove the temporary
    file it would write (and the destination's name is checked to fit). Returns where the
    file will land."""
    target = destination(path, what)
    remove_stale_temps(target)
    fd, tmp = _open_temp(target, what, path)
    os.close(fd)
    os.unlink(tmp)
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _sync_folder(folder: Path) -> None:
    """The rename on disk too: until its folder is synced, a power cut may bring back the old
    file (POSIX). Where a folder cannot be opened or synced (Windows, some file systems), the
    rename is all there is."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any], *,
                 what: str = "file") -> Path:
    """Call `write(fh)` on a temporary file beside `path`'s destination, then rename it over
    the destination. A file replaced keeps its mode (and owner, where allowed); a new one gets
    the usual 0666 less the umask. Returns the destination."""
    target = destination(path, what)
    remove_stale_temps(target)
    try:
        old = os.stat(target)
    except FileNotFoundError:
        old = None
    fd, tmp = _open_temp(target, what, path)
    try:
        try:
            os.fchmod(fd, stat.S_IMODE(old.st_mode) if old else 0o666 & ~_umask())
            if old is not None and (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(fd, old.st_uid, old.st_gid)
                except OSError:
                    pass
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
            _sync_folder(target.parent)
        except OSError as error:
            unchanged = f"{str(path)!r} is unchanged" if old else "nothing was written"
            raise _fail(what, path, f"{error.strerror or error}; {unchanged}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_json(path: str | os.PathLike, data: Any, what: str = "results") -> Path:
    """`data` as indented JSON at `path`, atomically (results files, like checkpoints)."""
    return atomic_write(path, lambda fh: fh.write(json.dumps(data, indent=1).encode()),
                        what=what)


def _key(path: str | os.PathLike) -> str:
    return os.path.realpath(_expand(path))


def check_distinct(outputs: Mapping[str, str | os.PathLike | None],
                   inputs: Mapping[str, str | os.PathLike | None] | None = None, *,
                   may_replace: set[str] | frozenset[str] = frozenset()) -> None:
    """Refuse two outputs that name the same file (links followed), and an output that would
    replace an input, except the outputs in `may_replace` (--save over the resumed file)."""
    for in_flag, path in (inputs or {}).items():
        if path is None:
            continue
        for flag, out in outputs.items():
            if out is not None and flag not in may_replace and _key(out) == _key(path):
                raise SmallemError(f"{flag} {str(out)!r} is the file given to {in_flag}: "
                                   "writing there would replace it; name another file")
    seen: dict[str, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        if _key(path) in seen:
            raise SmallemError(f"{seen[_key(path)]} and {flag} name the same file "
                               f"{str(path)!r}: the second write would replace the first; give "
                               "each its own file")
        seen[_key(path)] = flag


def rescue_places(target: Path) -> list[Path]:
    """Where a save that failed goes instead: the current folder, then the temporary folder,
    under a name that says what it is."""
    name = f"smallem-rescued-{os.getpid()}-{target.name[:NAME_IN_TEMP * 2]}"
    places = []
    for folder in (Path.cwd(), Path(tempfile.gettempdir())):
        if folder / name not in places and folder.resolve() != target.parent.resolve():
            places.append(folder / name)
    return places


def save_or_rescue(path: str | os.PathLike, save: Callable[[Path], Any], what: str = "checkpoint"
                   ) -> tuple[Path | None, str | None]:
    """Call `save(path)`; when that fails, `save` one of the rescue places instead.
    Returns (where it was saved or None, the failure's sentence or None)."""
    try:
        save(Path(path))
        return destination(path, what), None
    except SmallemError as error:
        problem = str(error)
    for place in rescue_places(_expand(path)):
        try:
            save(place)
            return place, problem
        except SmallemError:
            continue
    return None, problem

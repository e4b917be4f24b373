"""`smallem notebooks DEST`: the course's notebooks copied into a folder the learner chooses (a
wheel carries them as package data, smallem/notebooks/; a clone has them in notebooks/). A
notebook already there is never replaced: the shipped one is written beside it, and said.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import __version__
from ..errors import SmallemError
from ..files import atomic_write, not_a_file


def shipped() -> list[Path]:
    """The notebooks this smallem carries: the wheel's package data, else a clone's notebooks/."""
    from importlib import resources

    here = resources.files("smallem").joinpath("notebooks")
    folder = Path(str(here)) if here.is_dir() else Path(__file__).resolve().parents[2] / "notebooks"
    found = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise SmallemError("this smallem carries no notebooks (an install from neither the wheel "
                           "nor a clone): reinstall it from the wheel, `pip install smallem`")
    return found


def _beside(path: Path, data: bytes) -> tuple[Path, bool]:
    """A name beside `path` for the shipped copy, NAME.smallem-0.4.0.ipynb (then -2, -3, ...),
    and whether it is there already with these very bytes (a second copy into the folder)."""
    stem = f"{path.stem}.smallem-{__version__}"
    candidate, k = path.with_name(stem + ".ipynb"), 2
    while candidate.exists():
        if candidate.is_file() and candidate.read_bytes() == data:
            return candidate, True
        candidate, k = path.with_name(f"{stem}-{k}.ipynb"), k + 1
    return candidate, False


def copy_notebooks(destination: str | os.PathLike) -> list[str]:
    """Copy every notebook into `destination` (created if missing). One line per notebook that
    was not simply written: already there unchanged, or edited there and so written beside."""
    if not os.fspath(destination).strip():  # Path("") is the current folder: never what was meant
        raise SmallemError("the folder name is empty: name a folder for the notebooks (it is created "
                           "if missing)")
    folder = Path(os.path.expanduser(os.fspath(destination)))
    if folder.exists() and not folder.is_dir():
        raise SmallemError(f"{str(destination)!r} is {not_a_file(folder) or 'a file'}, not a folder: "
                           "name a folder for the notebooks (it is created if missing)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SmallemError(f"cannot create the folder {str(destination)!r} ({error.strerror}): "
                           "name a folder you can write") from None
    said = []
    for notebook in shipped():
        data = notebook.read_bytes()
        target = folder / notebook.name
        if target.exists():
            if target.is_file() and target.read_bytes() == data:
                continue  # this version's, untouched
            beside, there = _beside(target, data)
            if there:
                continue
            said.append(f"{target.name} is there and differs from smallem {__version__}'s (your "
                        f"edits are kept): the shipped one is written beside it as {beside.name}")
            target = beside
        atomic_write(target, lambda fh, data=data: fh.write(data), what="notebook")
    return said

"""Checkpoints: parameters by name, optimizer state, step, config and sampler state in one file.

The file is a NumPy .npz archive: arrays under "param/<name>" and "optim/<name>.<slot>", the
rest as JSON text under "meta". It is written atomically (temporary file in the same folder,
then os.replace) and read with allow_pickle=False: loading a checkpoint never runs code.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from .errors import SmallemError
from .nn import Module

FORMAT = "smallem-checkpoint"
VERSION = 1


@dataclass
class Checkpoint:
    meta: dict[str, Any]  # step, config, sampler state, history... (JSON)
    parameters: dict[str, np.ndarray]
    optimizer: dict[str, Any] | None = field(default=None)  # {"meta": ..., "tensors": ...}
    path: str = ""  # where it was read from, for messages

    @property
    def step(self) -> int:
        return int(self.meta.get("step", 0))

    @property
    def config(self) -> dict[str, Any]:
        return self.meta.get("config", {})


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any], *,
                 what: str = "file") -> Path:
    """Call `write(fh)` on a temporary file beside `path`, then rename it over `path`: a
    reader (or a crash) sees the old file or the new one, never half of one."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise SmallemError(f"cannot save {what} {str(path)!r}: folder {str(folder)!r} does "
                           "not exist")
    if path.is_dir():
        raise SmallemError(f"cannot save {what} {str(path)!r}: it is a folder; name a file")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """`data` as indented JSON at `path`, atomically (results files, like checkpoints)."""
    return atomic_write(path, lambda fh: fh.write(json.dumps(data, indent=1).encode()),
                        what="results")


def save_checkpoint(path: str | os.PathLike, model: Module, optimizer: Any = None,
                    meta: dict[str, Any] | None = None) -> Path:
    """Write `model`'s parameters, `optimizer`'s state and `meta` to `path`, atomically: a
    reader (or a crash) sees the old file or the new one, never half of one."""
    path = Path(path)
    named = model.named_parameters()
    meta = {"format": FORMAT, "version": VERSION, **(meta or {})}
    arrays = {f"param/{name}": p.numpy() for name, p in named}
    if optimizer is not None:
        state = optimizer.state_dict(named)
        meta["optimizer"] = state["meta"]
        arrays.update({f"optim/{k}": v for k, v in state["tensors"].items()})
    arrays["meta"] = np.array(json.dumps(meta))
    atomic_write(path, lambda fh: np.savez(fh, **arrays), what="checkpoint")
    return path


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint written by save_checkpoint, without pickle."""
    path = Path(path)
    if not path.is_file():
        raise SmallemError(f"checkpoint {str(path)!r} does not exist: pass a file written by "
                           "`smallem train --save FILE`")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError) as error:
        raise SmallemError(f"checkpoint {str(path)!r} cannot be read as a smallem checkpoint "
                           f"({type(error).__name__}): it is damaged or not a checkpoint") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise SmallemError(f"checkpoint {str(path)!r} is not a smallem checkpoint")
    params = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
    tensors = {k[len("optim/"):]: v for k, v in arrays.items() if k.startswith("optim/")}
    optimizer = {"meta": meta["optimizer"], "tensors": tensors} if "optimizer" in meta else None
    return Checkpoint(meta, params, optimizer, str(path))


def load_parameters(model: Module, parameters: dict[str, np.ndarray], source: str = "") -> None:
    """Give `model` the stored values: every name must match and every shape fit, checked
    before anything is changed."""
    where = f"checkpoint {source!r}" if source else "the checkpoint"
    named = model.named_parameters()
    names = [n for n, _ in named]
    for name, p in named:
        if name not in parameters:
            raise SmallemError(f"{where} has no parameter {name!r}, which the model needs: it "
                               "was saved from another model (or another --model)")
        if tuple(parameters[name].shape) != p.shape:
            raise SmallemError(f"parameter {name!r} has shape {list(parameters[name].shape)} in "
                               f"{where} but {list(p.shape)} in the model: it was saved with "
                               "another model configuration")
    extra = [n for n in parameters if n not in names]
    if extra:
        raise SmallemError(f"{where} holds parameter {extra[0]!r}, which the model does not "
                           "have: it was saved from another model")
    for name, p in named:
        p.assign(parameters[name], name)

"""Checkpoints: parameters by name, optimizer state, step, config and sampler state in one file.

The file is a NumPy .npz archive: arrays under "param/<name>" and "optim/<name>.<slot>", the
rest as JSON text under "meta". It is written atomically (files.atomic_write) and read without
pickle: loading a checkpoint never runs code. Like safetensors, every array's header is checked
against the bytes the file holds before anything is allocated, and the meta's types before
anything uses them: an edited or damaged file is one sentence, never a traceback.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SmallemError
from ..files import atomic_write, look_up
from ..nn import Module
from .config import LEGACY_TRANSFORMER_FIELDS, TrainConfig, config_from

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

    def train_config(self) -> TrainConfig:
        """The run's TrainConfig; one its model refuses (heads that do not divide the width)
        is this file's problem, and the sentence says so."""
        try:
            return config_from(self.config)
        except SmallemError as error:
            raise _damaged(f"checkpoint {self.path!r}", f"its config is refused ({error})") from None


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


DEFLATE_MAX_RATIO = 1032  # the most deflate can compress: bounds what a compressed member holds
EDITED = "the file was edited or damaged; use one written by `smallem train --save FILE`"


def _damaged(where: str, what: str) -> SmallemError:
    return SmallemError(f"{where}: {what}: {EDITED}")


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> np.ndarray:
    """One .npy member, its header checked against the bytes the member holds before the
    array is allocated (a header may claim a trillion elements)."""
    name = info.filename.removesuffix(".npy")
    stored = info.file_size
    if info.compress_type != zipfile.ZIP_STORED and stored > DEFLATE_MAX_RATIO * info.compress_size + 1024:
        raise _damaged(where, f"{name!r} claims {stored} bytes from {info.compress_size} "
                              "compressed ones, more than compression can give")
    with archive.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            raise _damaged(where, f"{name!r} is a .npy array of format {version}, not 1.0 or 2.0")
        shape, fortran, dtype = read_header(fh)
        if dtype.hasobject:
            raise _damaged(where, f"{name!r} holds Python objects, which are never unpickled")
        if dtype.kind not in ("U" if name == "meta" else "biuf"):
            raise _damaged(where, f"{name!r} holds {dtype.str} values, not "
                                  f"{'text' if name == 'meta' else 'numbers'}")
        need = math.prod(shape) * dtype.itemsize
        if need != stored - fh.tell():
            raise _damaged(where, f"{name!r} claims shape {list(shape)} of {dtype.name} ({need} "
                                  f"bytes) but holds {stored - fh.tell()} bytes")
    with archive.open(info) as fh:  # checked: now read it, header again included
        return np.lib.format.read_array(fh, allow_pickle=False)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _switches() -> dict[str, type]:
    """The config fields of registered models that are no size: a name or a true/false."""
    from dataclasses import fields

    from . import registry

    return {f.name: type(getattr(e.config(), f.name)) for e in registry.entries()
            for f in fields(e.config) if isinstance(getattr(e.config(), f.name), (bool, str))}


def _check_meta(meta: dict[str, Any], where: str) -> None:
    """The types of what the rest of smallem reads from a checkpoint's meta."""
    def bad(key: str, value: Any, expected: str) -> SmallemError:
        return _damaged(where, f"{key} is {repr(value)[:60]}, not {expected}")

    if "step" in meta and not _whole(meta["step"]):
        raise bad("step", meta["step"], "a whole number, 0 or more")
    config = meta.get("config", {})
    if not isinstance(config, dict):
        raise bad("config", config, "a mapping")
    for key in LEGACY_TRANSFORMER_FIELDS:  # 0.3 stored the Transformer's sizes flat
        if key in config and not _whole(config[key]):
            raise bad(f"config.{key}", config[key], "a whole number")
    for part in ("sizes", "mlp"):  # the model's sizes; "mlp" in the checkpoints of 0.3
        sizes = config.get(part, {})
        if not isinstance(sizes, dict):
            raise bad(f"config.{part}", sizes, "a mapping of sizes")
        switches = _switches()
        for key, value in sizes.items():  # a size, or a switch (the Transformer's attention)
            kind = switches.get(key)
            if not (isinstance(value, kind) if kind else _whole(value)):
                raise bad(f"config.{part}.{key}", value, {bool: "true or false", str: "a name"}
                          .get(kind, "a whole number"))
    for key in ("history", "interval"):
        if key in meta and not isinstance(meta[key], list):
            raise bad(key, meta[key], "a list")
    if not all(isinstance(r, dict) for r in meta.get("history", [])):
        raise bad("history", meta["history"], "a list of records")
    if "interval" in meta and not (len(meta["interval"]) == 2
                                   and all(map(_number, meta["interval"]))):
        raise bad("interval", meta["interval"], "[sum of losses, count]")
    if meta.get("initial_loss") is not None and not _number(meta["initial_loss"]):
        raise bad("initial_loss", meta["initial_loss"], "a number")
    if "optimizer" in meta and not isinstance(meta["optimizer"], dict):
        raise bad("optimizer", meta["optimizer"], "a mapping")
    if "sampler" in meta:
        try:  # what BatchSampler.load_state will do, on a generator of our own
            np.random.default_rng().bit_generator.state = meta["sampler"]
        except (TypeError, ValueError, KeyError, OverflowError):
            raise _damaged(where, "its sampler state cannot be restored into NumPy's "
                                  "generator") from None


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint written by save_checkpoint, without pickle."""
    path = Path(os.path.expanduser(os.fspath(path)))
    where = f"checkpoint {str(path)!r}"
    # a pipe's read would wait forever, /dev/zero never end: refused before opening
    kind = look_up(path, "checkpoint", "pass a file written by `smallem train --save FILE`")
    if kind not in (None, "missing"):
        raise SmallemError(f"{where} is {kind}, not a checkpoint: pass a file written by "
                           "`smallem train --save FILE`")
    if kind == "missing":
        raise SmallemError(f"{where} does not exist: pass a file written by "
                           "`smallem train --save FILE`")
    try:
        fh = open(path, "rb")
    except OSError as error:
        raise SmallemError(f"{where} cannot be opened: {(error.strerror or str(error)).lower()}; "
                           "check its permissions") from None
    try:
        with fh, zipfile.ZipFile(fh) as archive:
            arrays = {info.filename.removesuffix(".npy"): _read_member(archive, info, where)
                      for info in archive.infolist()}
        meta = json.loads(str(arrays.pop("meta")))
    except MemoryError:
        raise _damaged(where, "an array is larger than this machine's memory") from None
    except (zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError, RecursionError) as error:
        raise SmallemError(f"{where} cannot be read as a smallem checkpoint "
                           f"({type(error).__name__}): it is damaged or not a checkpoint") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise SmallemError(f"{where} is not a smallem checkpoint")
    _check_meta(meta, where)
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


def non_finite(parameters: dict[str, Any]) -> tuple[str, str] | None:
    """(name, "NaN" or "infinity") of the first parameter holding a value that is not a finite
    number, or None. Accepts host arrays or Parameters."""
    for name, value in parameters.items():
        array = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        if not np.isfinite(array).all():
            return name, "NaN" if np.isnan(array).any() else "infinity"
    return None


def check_finite(parameters: dict[str, np.ndarray], source: str = "") -> None:
    """Refuse weights that hold NaN or infinity, naming the parameter."""
    bad = non_finite(parameters)
    if bad is not None:
        where = f"checkpoint {source!r}" if source else "the checkpoint"
        raise SmallemError(f"parameter {bad[0]!r} holds {bad[1]} in {where}: the run that wrote "
                           "it diverged; use an earlier checkpoint, or train again with a lower "
                           "--lr")

"""Results recorded on hardware a learner may not have (an H200), shipped inside the package in
the folder of the lesson that shows them (course/l14_precision/recorded/precision_h200.json, ...).

A notebook shows them where the hardware is missing; they are package data, so a notebook
opened from a wheel install, a copied folder or a hosted service finds them. `recorded(name)`
finds a file by its name in whichever lesson's folder holds it (a name is shipped once: a test
says so). Some are copies of `benchmarks/results/round2/` (tests/test_portability.py keeps them equal).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from ...errors import SmallemError
from .. import lesson_folders


def _files(suffix: str) -> dict[str, Any]:
    """Every recorded file ending in `suffix` in the lessons' folders, by its name without it."""
    folders = [resources.files(f"smallem.course.{name}").joinpath("recorded") for name in lesson_folders()]
    return {file.name[:-len(suffix)]: file for folder in folders if folder.is_dir()
            for file in folder.iterdir() if file.name.endswith(suffix)}


def names() -> list[str]:
    """The recorded results there are, without their `.json`."""
    return sorted(_files(".json"))


def recorded(name: str) -> dict[str, Any]:
    """The recorded result `name` (e.g. "bench_h200"), read from the package's own copy."""
    file = _files(".json").get(name)
    if file is None:
        raise SmallemError(f"no recorded result named {name!r}: there are {', '.join(names())}")
    return json.loads(file.read_text(encoding="utf-8"))


def trained_names() -> list[str]:
    """The trained models shipped (recorded/<name>.npz), without their `.npz`."""
    return sorted(_files(".npz"))


def trained(name: str = "transformer_trained", backend: str = "cpu") -> tuple[Any, dict[str, Any]]:
    """A model trained on the H200 and shipped with the package (float16 weights, read into the
    backend's own precision), and its run's meta (config, history, where it came from):
    "transformer_trained" (the default Transformer, 10,000 steps) or "mlp_trained" (the default
    MLP, 20,000 steps), both `smallem train --backend gpu` on the standard library's sources."""
    from ...training.generate import load_model

    file = _files(".npz").get(name)
    if file is None:
        raise SmallemError(f"no trained model named {name!r}: there are {', '.join(trained_names())}")
    with resources.as_file(file) as path:
        model, checkpoint = load_model(path, backend)
    return model, checkpoint.meta

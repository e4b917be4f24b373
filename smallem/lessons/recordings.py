"""Results recorded on hardware a learner may not have (an H200), shipped inside the package.

A notebook shows them where the hardware is missing; they are package data, so a notebook
opened from a wheel install, a copied folder or a hosted service finds them. The files are
copies of `benchmarks/results/round2/` (tests/test_portability.py keeps them equal).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from ..errors import SmallemError


def names() -> list[str]:
    """The recorded results there are, without their `.json`."""
    folder = resources.files(__package__).joinpath("recorded")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def recorded(name: str) -> dict[str, Any]:
    """The recorded result `name` (e.g. "bench_h200"), read from the package's own copy."""
    file = resources.files(__package__).joinpath("recorded", f"{name}.json")
    if not file.is_file():
        raise SmallemError(f"no recorded result named {name!r}: there are {', '.join(names())}")
    return json.loads(file.read_text(encoding="utf-8"))


def trained_names() -> list[str]:
    """The trained models shipped (recorded/<name>.npz), without their `.npz`."""
    folder = resources.files(__package__).joinpath("recorded")
    return sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".npz"))


def trained(name: str = "transformer_trained", backend: str = "cpu") -> tuple[Any, dict[str, Any]]:
    """A model trained on the H200 and shipped with the package (float16 weights, read into the
    backend's own precision), and its run's meta (config, history, where it came from):
    "transformer_trained" (the default Transformer, 10,000 steps) or "mlp_trained" (the default
    MLP, 20,000 steps), both `smallem train --backend gpu` on the standard library's sources."""
    from ..training.generate import load_model

    file = resources.files(__package__).joinpath("recorded", f"{name}.npz")
    if not file.is_file():
        raise SmallemError(f"no trained model named {name!r}: there are {', '.join(trained_names())}")
    with resources.as_file(file) as path:
        model, checkpoint = load_model(path, backend)
    return model, checkpoint.meta

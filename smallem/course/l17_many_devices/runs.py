"""Lesson 17's recorded runs (recorded/<name>.json, package data): runs a notebook shows where
they cannot be made, such as several GPUs. A placeholder (`"placeholder": true`) says honestly
that no such run exists yet."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from ...errors import SmallemError


def recorded(name: str) -> dict[str, Any]:
    """The recorded result `name` (e.g. "gpu_ranks"), read from this lesson's own folder."""
    folder = resources.files(__package__).joinpath("recorded")
    file = folder.joinpath(f"{name}.json")
    if not file.is_file():
        names = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))
        raise SmallemError(f"lesson 17 has no recorded result named {name!r}: there are {', '.join(names)}")
    return json.loads(file.read_text(encoding="utf-8"))

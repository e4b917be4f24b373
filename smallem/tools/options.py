"""The options of `smallem train`, derived rather than written: one per TrainConfig field, and
one per field a registered model offers (training/registry.py), a size or a switch; the sentences
that name them as typed. cli.py builds its parsers with them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..errors import SmallemError


def as_typed(message: str) -> str:
    """A TrainConfig sentence about a field ("log every must be ...") naming the option as
    typed ("--log-every must be ...")."""
    from ..training.config import TrainConfig

    for name, _, _ in TrainConfig.options():
        spoken = name.replace("_", " ")
        if message.startswith(f"{spoken} must "):
            return f"--{name.replace('_', '-')}{message[len(spoken):]}"
    return message


def sizes_of(model: str, sized: dict, saved: dict | None) -> dict | None:
    """The sizes of `model` given on the command line over the checkpoint's (`saved`), after
    refusing a size option of another model's config (`--model mlp --context 32`)."""
    from ..training import registry

    entry = registry.get(model)
    for name in sized:
        if name not in entry.options:
            owners = [e for e in registry.entries() if name in e.options]
            switch = isinstance(getattr(owners[0].config(), name), bool)  # how it runs, not a size
            raise SmallemError(f"--{name.replace('_', '-')} is {'an option' if switch else 'a size'} "
                               f"of the {' and the '.join(e.name for e in owners)}, not of the "
                               f"{model}: drop it, or train --model {owners[0].name}")
    sizes = {**(saved or {}), **sized}
    return sizes or None


_TYPES = {"int": int, "int | None": int, "float": float, "str": str, "float | None": float, "str | None": str,
          "bool": bool}


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """One option per TrainConfig field that is one, its help and default read from there;
    then one per size a registered model offers (registry.py), read from its config class."""
    from dataclasses import fields

    from ..backends import BACKEND_NAMES, PRECISIONS
    from ..optim import OPTIMIZERS
    from ..training import registry
    from ..training.config import TOKENS, TrainConfig

    types = {f.name: f.type for f in fields(TrainConfig)}
    # The allowed values shown as {a,b}, read from where they are checked.
    choices = {"model": registry.names(), "optimizer": OPTIMIZERS, "backend": BACKEND_NAMES,
               "precision": PRECISIONS, "tokens": TOKENS}
    for name, default, meta in TrainConfig.options():
        if isinstance(default, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction,
                                default=None, help=meta["help"] + f" (default {default})")
            continue
        shown = "" if default is None else f" (default {default:,})" if isinstance(
            default, int) else f" (default {default})"
        metavar = choice_names(choices[name]) if name in choices else meta.get("metavar")
        parser.add_argument(f"--{name.replace('_', '-')}", type=_TYPES[str(types[name])],
                            metavar=metavar, help=meta["help"] + shown)
    offered: dict[str, list[str]] = {}  # option -> what each model that has it says of it
    kinds: dict[str, type] = {}
    for entry in registry.entries():
        for f in fields(entry.config):
            if f.name in entry.options:
                if f.name in types:
                    raise SmallemError(f"model {entry.name!r} offers a size named {f.name!r}, "
                                       "an option of every run already: rename it")
                kinds[f.name] = f.type if isinstance(f.type, type) else _TYPES[f.type]
                default = getattr(entry.config(), f.name)
                shown = default if isinstance(default, (bool, str)) else f"{default:,}"
                offered.setdefault(f.name, []).append(
                    f"{entry.name}: {entry.options[f.name]} (default {shown})")
    for name, helps in offered.items():  # a true/false field: --checkpoint-blocks, --no-...
        kind = {"action": argparse.BooleanOptionalAction} if kinds[name] is bool else {"type": kinds[name]}
        parser.add_argument(f"--{name.replace('_', '-')}", help="; ".join(helps), **kind)
    parser.set_defaults(size_options=tuple(offered))


def choice_names(names: Sequence[str]) -> str:
    """argparse's way of listing choices, {a,b}, for options checked by the package itself
    (a wrong value is then one sentence, not a usage message)."""
    return "{" + ",".join(names) + "}"


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """--threads N: the float32 CPU's threads (backends/cpu/threads.py), as SMALLEM_THREADS."""
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads for the float32 "
                        "CPU backend (default: SMALLEM_THREADS, else the physical cores the "
                        "machine's load leaves free, decided at the start of each run)")


def use_threads(args: argparse.Namespace) -> None:
    """--threads N becomes SMALLEM_THREADS=N for this command and the processes it starts
    (bench's rows run in processes of their own)."""
    n = getattr(args, "threads", None)
    if n is None:
        return
    if n < 1:
        raise SmallemError(f"--threads {n}: give 1 or more (or leave it out to let smallem choose)")
    import os

    from ..backends.cpu.threads import ENV, too_many

    too_many(n, f"--threads {n}")

    os.environ[ENV] = str(n)

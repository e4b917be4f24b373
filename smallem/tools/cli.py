"""The command line: `smallem <command>` and `python -m smallem <command>`.

Each command parses its arguments here and calls the package; a SmallemError becomes one line
on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import warnings
from collections.abc import Sequence

from ..errors import SmallemError, SmallemWarning


def _gradcheck(args: argparse.Namespace) -> int:
    from ..autodiff.gradcheck import compare_backends, format_table, run_all

    if args.backend == "cpu64":
        results = run_all("cpu64")
    else:
        from ..backends import get_backend

        name = get_backend(args.backend).name  # "auto" becomes what it picks
        print(f"{name} computes in float32, which cannot carry finite differences at 1e-6 "
              f"(notebook 04 shows why): its tape gradients are compared with cpu64's instead.")
        results = compare_backends(name)
    print(format_table(results))
    return 0 if all(r.passed for r in results) else 1


def _check_output(flag: str, path: str | None) -> None:
    """Refuse an output path that cannot be written before the work starts, not after it, with
    the code that writes it (files.check_writable creates and removes the temporary file)."""
    from ..files import check_writable

    if path is not None:
        check_writable(path, flag)


def _as_typed(message: str) -> str:
    """A TrainConfig sentence about a field ("log every must be ...") naming the option as
    typed ("--log-every must be ...")."""
    from ..training.config import TrainConfig

    for name, _, _ in TrainConfig.options():
        spoken = name.replace("_", " ")
        if message.startswith(f"{spoken} must "):
            return f"--{name.replace('_', '-')}{message[len(spoken):]}"
    return message


def _sizes_of(model: str, sized: dict, saved: dict | None) -> dict | None:
    """The sizes of `model` given on the command line over the checkpoint's (`saved`), after
    refusing a size option of another model's config (`--model mlp --context 32`)."""
    from ..training import registry

    entry = registry.get(model)
    for name in sized:
        if name not in entry.options:
            owners = [e.name for e in registry.entries() if name in e.options]
            raise SmallemError(f"--{name} is a size of the {' and the '.join(owners)}, not of "
                               f"the {model}: drop it, or train --model {owners[0]}")
    sizes = {**(saved or {}), **sized}
    return sizes or None


def _train(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..files import check_distinct, destination
    from ..training.config import TrainConfig, config_from
    from ..training.generate import sample
    from ..training.loop import train

    # --resume FILE saves back to FILE unless --save says where else.
    save = args.save if args.save is not None else args.resume
    check_distinct({"--save": save, "--json": args.json, "--health": args.health},
                   {"--resume": args.resume}, may_replace={"--save"})
    for flag, path in (("--save", save), ("--json", args.json), ("--health", args.health)):
        _check_output(flag, path)  # before the run, not after hours of it
    # Options left out (None) keep their default, or the checkpoint's value under --resume.
    given = {name: getattr(args, name) for name, _, _ in TrainConfig.options()
             if getattr(args, name) is not None}
    sized = {name: getattr(args, name) for name in args.size_options
             if getattr(args, name) is not None}
    checkpoint = None
    try:
        base: dict = {}
        if args.resume:
            from ..training.checkpoint import load_checkpoint

            checkpoint = load_checkpoint(args.resume)
            base = asdict(config_from(checkpoint.config))
        model = given.get("model", base.get("model", TrainConfig.model))
        sizes = _sizes_of(model, sized, base.get("sizes") if base.get("model") == model else None)
        config = TrainConfig(**{**base, **given, "sizes": sizes})
    except SmallemError as error:
        raise SmallemError(_as_typed(str(error))) from None
    if config.optimizer == "sgd" and "weight_decay" in given:
        raise SmallemError("--weight-decay applies to AdamW only (SGD here has no decay): "
                           "drop it, or use --optimizer adamw")
    monitor = None
    if args.health:
        from ..training.config import build_model
        from ..training.health import HealthMonitor

        # A model built the same way names the parameters; the run builds its own.
        monitor = HealthMonitor(args.health_every, build_model(config, "cpu64"), sink=args.health)
    try:
        # A bar on a terminal; in a redirected log, the log lines alone (a bar there is
        # thousands of carriage-return updates).
        result = train(config, resume=checkpoint, save=save, observer=monitor,
                       progress=sys.stderr.isatty())
    finally:
        if monitor is not None:
            monitor.close()
    gain = result.bigram_held_out_loss - result.held_out_loss
    print(f"held-out loss {result.held_out_loss:.4f} after {result.steps} steps, "
          f"{abs(gain):.4f} nats {'below' if gain >= 0 else 'above'} the closed-form bigram "
          f"({result.bigram_held_out_loss:.4f}); initial loss {result.initial_loss:.4f}; "
          f"{result.steps_per_second:.1f} steps/s on {result.backend}")
    if monitor is not None:
        print(f"training health ({len(monitor.records)} samples, every {args.health_every} "
              f"steps) written to {args.health}")
    if args.json:  # before the sample: nothing after the run may lose its results
        from ..files import write_json

        write_json(args.json, result.to_json())
        print(f"results written to {args.json}")
    if result.checkpoint is not None:
        print(f"checkpoint saved to {result.checkpoint}")
    if result.diverged_at is None:
        print("sample:", sample(result.model, "", 200, temperature=0.8, seed=config.seed))
    # Exit 1 when the run diverged or its checkpoint is not where it was asked to go.
    kept = save is None or result.checkpoint == str(destination(save))
    return 0 if result.diverged_at is None and kept else 1


def _sample(args: argparse.Namespace) -> int:
    from ..training.generate import load_model, sample

    model, _ = load_model(args.checkpoint, args.backend)
    # A byte-level model takes any bytes: a prompt that is not UTF-8 reaches Python as lone
    # surrogates (PEP 383), which give back the bytes typed.
    prompt = args.prompt.encode("utf-8", "surrogateescape")
    text = sample(model, prompt, args.bytes, args.temperature, args.seed)
    print(prompt.decode("utf-8", "replace") + text)
    return 0


def _checks(args: argparse.Namespace) -> int:
    from ..data import load_corpus
    from ..training.checks import format_checks, run_checks

    results = run_checks(args.backend, load_corpus(args.corpus), args.model)
    print(format_checks(results))
    return 1 if any(r.status == "fail" for r in results) else 0


def _bench(args: argparse.Namespace) -> int:
    from .bench import main as bench

    if not (1 <= args.block <= args.steps) or args.warmup < 0:
        raise SmallemError(f"--steps ({args.steps}) must be at least --block ({args.block}), "
                           f"--block at least 1 and --warmup ({args.warmup}) 0 or more")
    _check_output("--json", args.json)
    status = bench(args.steps, args.warmup, args.block, torch=not args.no_torch,
                   cpu64=not args.no_cpu64, corpus=args.corpus, json_path=args.json,
                   model=args.model)
    if not args.no_torch and importlib.util.find_spec("torch") is None:
        print("PyTorch is not installed here, so its rows and the 'vs torch' and 'vs graph' "
              "columns are empty (`pip install torch` fills them; smallem does not need it).")
    return status


def _figures(args: argparse.Namespace) -> int:
    from .figures import main as figures

    return figures(args.out, args.only, args.steps, args.batch, args.backend, args.corpus)


_TYPES = {"int": int, "int | None": int, "float": float, "str": str, "float | None": float, "str | None": str}


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    """One option per TrainConfig field that is one, its help and default read from there;
    then one per size a registered model offers (registry.py), read from its config class."""
    from dataclasses import fields

    from ..backends import BACKEND_NAMES
    from ..optim import OPTIMIZERS
    from ..training import registry
    from ..training.config import TrainConfig

    types = {f.name: f.type for f in fields(TrainConfig)}
    # The allowed values shown as {a,b}, read from where they are checked.
    choices = {"model": registry.names(), "optimizer": OPTIMIZERS, "backend": BACKEND_NAMES}
    for name, default, meta in TrainConfig.options():
        if isinstance(default, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction,
                                default=None, help=meta["help"] + f" (default {default})")
            continue
        shown = "" if default is None else f" (default {default:,})" if isinstance(
            default, int) else f" (default {default})"
        metavar = _names(choices[name]) if name in choices else meta.get("metavar")
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
                offered.setdefault(f.name, []).append(
                    f"{entry.name}: {entry.options[f.name]} (default "
                    f"{getattr(entry.config(), f.name):,})")
    for name, helps in offered.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kinds[name], help="; ".join(helps))
    parser.set_defaults(size_options=tuple(offered))


DESCRIPTION = """\
smallem teaches backpropagation by building it: JupyterLab notebooks and the package they
import (a tape that differentiates what it records, NumPy and CuPy backends, a byte-level
language model). This command checks its gradients, trains and samples the model, times a
training step and redraws the figures."""

EXAMPLES = """\
examples:
  smallem gradcheck                          every gradient rule against finite differences
  smallem train --steps 2000 --save run.npz  a short CPU or GPU run, checkpointed
  smallem sample --checkpoint run.npz --prompt "class " --temperature 0.7

`smallem COMMAND --help` lists a command's options; the lessons: jupyter lab notebooks/"""


def _names(names: Sequence[str]) -> str:
    """argparse's way of listing choices, {a,b}, for options checked by the package itself
    (a wrong value is then one sentence, not a usage message)."""
    return "{" + ",".join(names) + "}"


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from ..backends import BACKEND_NAMES, DEFAULT_BACKEND
    from . import bench

    parser = argparse.ArgumentParser(prog="smallem", description=DESCRIPTION, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"smallem {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    backends = _names(BACKEND_NAMES)

    p = sub.add_parser("gradcheck", help="check every primitive and operation by finite differences")
    p.add_argument("--backend", default="cpu64", metavar=backends,
                   help="cpu64 (default): finite differences in float64 "
                   "at 1e-6; cpu or gpu (float32): their tape gradients against cpu64's at 1e-4")
    p.set_defaults(run=_gradcheck)

    from ..training.checks import checked_models
    from ..training.config import HEALTH_EVERY, TrainConfig

    p = sub.add_parser("train", help="train the byte MLP (or the bigram, or a Transformer) and "
                       "report held-out loss")
    _add_config_options(p)
    p.add_argument("--save", metavar="FILE", help="write a checkpoint there (atomically), "
                   f"every {TrainConfig().save_every:,} steps, at the end and on Ctrl-C or SIGTERM")
    p.add_argument("--resume", metavar="FILE", help="continue a checkpoint exactly; saves back "
                   "to FILE unless --save names another")
    p.add_argument("--json", metavar="FILE", help="write config, losses and history there")
    p.add_argument("--health", metavar="FILE", help="write training-health statistics there, "
                   "one JSON line per sample (activations, gradient norms, update ratios) and "
                   "per log line")
    p.add_argument("--health-every", type=int, default=HEALTH_EVERY, metavar="N",
                   help=f"steps between two health samples (default {HEALTH_EVERY})")
    p.set_defaults(run=_train)

    p = sub.add_parser("sample", help="generate bytes from a checkpoint")
    p.add_argument("--checkpoint", required=True, metavar="FILE")
    p.add_argument("--prompt", default="", help="text to continue (default: a new document)")
    p.add_argument("--bytes", type=int, default=200, help="how many bytes to generate")
    p.add_argument("--temperature", type=float, default=1.0, help="0: always the likeliest")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default=DEFAULT_BACKEND, metavar=backends,
                   help=f"{DEFAULT_BACKEND} (default, as load_model), cpu, cpu64 or gpu")
    p.set_defaults(run=_sample)

    p = sub.add_parser("checks", help="initial loss, overfit one batch, CPU vs GPU agreement")
    p.add_argument("--backend", default="auto", metavar=backends,
                   help="auto (default), cpu, cpu64 or gpu")
    p.add_argument("--corpus", help="a text file or folder (default: the standard library)")
    p.add_argument("--model", default="mlp", choices=checked_models(),
                   help="which model's default sizes to check (default mlp)")
    p.set_defaults(run=_checks)

    p = sub.add_parser("bench", help="time a training step (the MLP's or a Transformer's) on every "
                       "backend, against the same model by hand (NumPy, CuPy) and in PyTorch")
    p.add_argument("--model", choices=tuple(bench.BENCHED), default="mlp",
                   help="mlp (default, batch 256) or transformer (batch 64: smallem plain and "
                   "captured against PyTorch eager and CUDA graph, with and without SDPA)")
    p.add_argument("--steps", type=int, default=bench.STEPS,
                   help=f"timed steps per row (default {bench.STEPS})")
    p.add_argument("--warmup", type=int, default=bench.WARMUP,
                   help=f"untimed steps first (default {bench.WARMUP})")
    p.add_argument("--block", type=int, default=bench.BLOCK, help="steps between two device syncs "
                   f"(default {bench.BLOCK}); the median is over blocks")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument("--no-cpu64", action="store_true", help="leave the float64 rows out")
    p.add_argument("--corpus", help="a text file or folder (default: the standard library)")
    p.add_argument("--json", metavar="FILE", help="write the table as JSON there")
    p.set_defaults(run=_bench)

    from ..training.config import BATCH
    from .figures import FIGURES, STEPS

    p = sub.add_parser("figures", help="redraw the PNGs of figures/ (fixed seeds: same bytes)")
    p.add_argument("--out", default="figures", metavar="DIR", help="where (default figures/)")
    p.add_argument("--only", nargs="+", metavar="NAME", help=f"some of {_names(FIGURES)}")
    p.add_argument("--steps", type=int, default=STEPS, help="training steps behind "
                   f"mlp_vs_bigram and sgd_vs_adamw (default {STEPS}: a few minutes on CPU)")
    p.add_argument("--batch", type=int, default=BATCH, help=f"their batch size (default {BATCH})")
    p.add_argument("--backend", default="cpu", metavar=backends, help="cpu (default: the same bytes on every "
                   "run), cpu64 or gpu")
    p.add_argument("--corpus", help="a text file or folder (default: the standard library)")
    p.set_defaults(run=_figures)
    return parser


# What to ask less of when memory runs out.
SMALLER = {"train": "a smaller --batch", "figures": "a smaller --batch", "sample": "fewer --bytes",
           "bench": "a smaller corpus"}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = warnings.showwarning

    def show(message, category, *rest):  # noqa: ANN001, ANN002
        if not issubclass(category, SmallemWarning):
            return previous(message, category, *rest)
        print(f"smallem {args.command}: warning: {message}", file=sys.stderr)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", SmallemWarning)
            # NumPy's overflow warnings of a diverging run: train says it in one sentence
            warnings.filterwarnings("ignore", r"(overflow|invalid value|divide by zero) "
                                    "encountered", RuntimeWarning)
            warnings.showwarning = show
            return args.run(args)
    except SmallemError as error:
        print(f"smallem {args.command}: error: {error}", file=sys.stderr)
        return 2
    except MemoryError as error:
        print(f"smallem {args.command}: error: out of memory ({error or 'MemoryError'}): ask for "
              f"less, e.g. {SMALLER.get(args.command, 'smaller sizes')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:  # train.Interrupted says what was saved
        print(f"smallem {args.command}: {error or 'interrupted'}", file=sys.stderr)
        return 128 + int(getattr(error, "signum", 2))


if __name__ == "__main__":
    sys.exit(main())

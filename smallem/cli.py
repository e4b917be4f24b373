"""The command line: `smallem <command>` and `python -m smallem <command>`.

Each command parses its arguments here and calls the package; a SmallemError becomes one line
on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .errors import SmallemError


def _gradcheck(args: argparse.Namespace) -> int:
    from .gradcheck import compare_backends, format_table, run_all

    if args.backend == "cpu64":
        results = run_all("cpu64")
    else:
        from .backends import get_backend

        name = get_backend(args.backend).name  # "auto" becomes what it picks
        print(f"{name} computes in float32, which cannot carry finite differences at 1e-6 "
              f"(notebook 04 shows why): its tape gradients are compared with cpu64's instead.")
        results = compare_backends(name)
    print(format_table(results))
    return 0 if all(r.passed for r in results) else 1


def _check_output(flag: str, path: str | None) -> None:
    """Refuse an output path that cannot be written before the work starts, not after it."""
    from pathlib import Path

    if path is None:
        return
    if Path(path).expanduser().is_dir():
        raise SmallemError(f"{flag} {path}: that is a folder; name a file in it")
    if not Path(path).expanduser().resolve().parent.is_dir():
        raise SmallemError(f"{flag} {path}: folder {str(Path(path).parent)!r} does not exist; "
                           "create it first")


def _train(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from .config import TrainConfig, config_from
    from .sample import sample
    from .train import train

    for flag, path in (("--save", args.save), ("--json", args.json)):
        _check_output(flag, path)  # before the run, not after hours of it
    # Options left out (None) keep their default, or the checkpoint's value under --resume.
    given = {name: getattr(args, name) for name, _, _ in TrainConfig.options()
             if getattr(args, name) is not None}
    checkpoint = None
    if args.resume:
        from .checkpoint import load_checkpoint

        checkpoint = load_checkpoint(args.resume)
        config = TrainConfig(**{**asdict(config_from(checkpoint.config)), **given})
    else:
        config = TrainConfig(**given)
    result = train(config, resume=checkpoint, save=args.save)
    gain = result.bigram_held_out_loss - result.held_out_loss
    print(f"held-out loss {result.held_out_loss:.4f} after {result.steps} steps, "
          f"{abs(gain):.4f} nats {'below' if gain >= 0 else 'above'} the closed-form bigram "
          f"({result.bigram_held_out_loss:.4f}); initial loss {result.initial_loss:.4f}; "
          f"{result.steps_per_second:.1f} steps/s on {result.backend}")
    print("sample:", sample(result.model, "", 200, temperature=0.8, seed=config.seed))
    if args.json:
        from .checkpoint import write_json

        write_json(args.json, result.to_json())
        print(f"results written to {args.json}")
    return 0


def _sample(args: argparse.Namespace) -> int:
    from .sample import load_model, sample

    model, _ = load_model(args.checkpoint, args.backend)
    text = sample(model, args.prompt, args.bytes, args.temperature, args.seed)
    print(args.prompt + text)
    return 0


def _checks(args: argparse.Namespace) -> int:
    from .checks import format_checks, run_checks
    from .data import load_corpus

    results = run_checks(args.backend, load_corpus(args.corpus))
    print(format_checks(results))
    return 1 if any(r.status == "fail" for r in results) else 0


def _bench(args: argparse.Namespace) -> int:
    from .bench import main as bench

    if not (1 <= args.block <= args.steps) or args.warmup < 0:
        raise SmallemError(f"--steps ({args.steps}) must be at least --block ({args.block}), "
                           f"--block at least 1 and --warmup ({args.warmup}) 0 or more")
    _check_output("--json", args.json)
    return bench(args.steps, args.warmup, args.block, torch=not args.no_torch,
                 cpu64=not args.no_cpu64, corpus=args.corpus, json_path=args.json)


def _figures(args: argparse.Namespace) -> int:
    from .figures import main as figures

    return figures(args.out, args.only, args.steps, args.batch, args.backend, args.corpus)


_TYPES = {"int": int, "float": float, "str": str, "float | None": float, "str | None": str}


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    """One option per TrainConfig field that is one, its help and default read from there."""
    from dataclasses import fields

    from .config import TrainConfig

    types = {f.name: f.type for f in fields(TrainConfig)}
    for name, default, meta in TrainConfig.options():
        if isinstance(default, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction,
                                default=None, help=meta["help"] + f" (default {default})")
            continue
        shown = "" if default is None else f" (default {default:,})" if isinstance(
            default, int) else f" (default {default})"
        parser.add_argument(f"--{name.replace('_', '-')}", type=_TYPES[str(types[name])],
                            metavar=meta.get("metavar"), help=meta["help"] + shown)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smallem", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("gradcheck", help="check every primitive and operation by finite differences")
    p.add_argument("--backend", default="cpu64", help="cpu64 (default): finite differences in float64 "
                   "at 1e-6; cpu or gpu (float32): their tape gradients against cpu64's at 1e-4")
    p.set_defaults(run=_gradcheck)

    p = sub.add_parser("train", help="train the byte MLP (or the bigram) and report held-out loss")
    _add_config_options(p)
    p.add_argument("--save", metavar="FILE", help="write a checkpoint there (atomically)")
    p.add_argument("--resume", metavar="FILE", help="continue a checkpoint exactly")
    p.add_argument("--json", metavar="FILE", help="write config, losses and history there")
    p.set_defaults(run=_train)

    p = sub.add_parser("sample", help="generate bytes from a checkpoint")
    p.add_argument("--checkpoint", required=True, metavar="FILE")
    p.add_argument("--prompt", default="", help="text to continue (default: a new document)")
    p.add_argument("--bytes", type=int, default=200, help="how many bytes to generate")
    p.add_argument("--temperature", type=float, default=1.0, help="0: always the likeliest")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="cpu", help="cpu (default), cpu64 or gpu")
    p.set_defaults(run=_sample)

    p = sub.add_parser("checks", help="initial loss, overfit one batch, CPU vs GPU agreement")
    p.add_argument("--backend", default="auto", help="auto (default), cpu, cpu64 or gpu")
    p.add_argument("--corpus", help="a text file or folder (default: the standard library)")
    p.set_defaults(run=_checks)

    p = sub.add_parser("bench", help="time the MLP training step on every backend, against "
                       "the same model by hand (NumPy, CuPy) and in PyTorch")
    p.add_argument("--steps", type=int, default=500, help="timed steps per row (default 500)")
    p.add_argument("--warmup", type=int, default=50, help="untimed steps first (default 50)")
    p.add_argument("--block", type=int, default=50, help="steps between two device syncs "
                   "(default 50); the median is over blocks")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument("--no-cpu64", action="store_true", help="leave the float64 rows out")
    p.add_argument("--corpus", help="a text file or folder (default: the standard library)")
    p.add_argument("--json", metavar="FILE", help="write the table as JSON there")
    p.set_defaults(run=_bench)

    from .figures import BATCH, FIGURES, STEPS

    p = sub.add_parser("figures", help="redraw the PNGs of figures/ (fixed seeds: same bytes)")
    p.add_argument("--out", default="figures", metavar="DIR", help="where (default figures/)")
    p.add_argument("--only", nargs="+", metavar="NAME", help=f"some of: {', '.join(FIGURES)}")
    p.add_argument("--steps", type=int, default=STEPS, help="training steps behind "
                   f"mlp_vs_bigram and sgd_vs_adamw (default {STEPS}: a few minutes on CPU)")
    p.add_argument("--batch", type=int, default=BATCH, help=f"their batch size (default {BATCH})")
    p.add_argument("--backend", default="cpu", help="cpu (default: the same bytes on every "
                   "run), cpu64 or gpu")
    p.add_argument("--corpus", help="a text file or folder (default: the standard library)")
    p.set_defaults(run=_figures)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except SmallemError as error:
        print(f"smallem {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"smallem {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The command line: `smallem <command>` and `python -m smallem <command>`.

Each command here calls the package with what parser.py parsed; a SmallemError becomes one line
on stderr and exit status 2, a Ctrl-C one line from the first instant, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import SmallemError, SmallemWarning, require
from .options import as_typed, sizes_of
from .parser import build_parser, refuse_mistyped, refuse_unknown

if TYPE_CHECKING:
    from ..training.config import TrainConfig


def _gradcheck(args: argparse.Namespace) -> int:
    from ..autodiff.gradcheck import compare_backends, format_table, run_all

    if args.precision not in (None, "fp32"):  # a lower precision: float64's gradients the truth
        from ..backends import get_backend
        from ..backends.precision import get_format, tolerance

        backend = get_backend("cpu" if args.backend == "cpu64" else args.backend,
                              get_format(args.precision).name)
        print(f"{backend.name} with {args.precision} matrix inputs: its tape gradients against "
              f"cpu64's on the same inputs, to 8 eps of {args.precision} = {tolerance(args.precision):.1e}")
        results = compare_backends(backend, tolerance=tolerance(args.precision))
    elif args.backend == "cpu64":
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


def _smaller(config: TrainConfig) -> str:
    """What to ask less of: the size or batch furthest above its default, by how much."""
    from ..training.config import largest_ask

    ask = largest_ask(config)
    if ask is None:
        return "a smaller --batch"
    name, value, default = ask
    why = " (attention's memory grows with its square)" if name == "context" and config.sequences \
        else ""
    return (f"a smaller --{name}: it is {value:,}, {value / default:,.0f}× the {config.model}'s "
            f"default {default:,}{why}")


def _train(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..files import check_distinct, destination
    from ..training.config import TrainConfig
    from ..training.generate import sample
    from ..training.loop import train
    from .token_options import run_tokenizer, score_text

    if args.ranks is not None:
        from ..ranks.launch import ranks_of_train

        spawned = ranks_of_train(args.ranks, args.argv)
        if spawned is not None:  # this process started the ranks and waited for them
            return spawned
    # --resume FILE saves back to FILE unless --save says where else.
    save = args.save if args.save is not None else args.resume
    outputs = {"--save": save, "--json": args.json, "--health": args.health}
    check_distinct(outputs, {"--resume": args.resume}, may_replace={"--save"})
    check_distinct(outputs, {"--corpus": args.corpus, "--merges": args.merges})
    for flag, path in (("--save", save), ("--json", args.json), ("--health", args.health)):
        _check_output(flag, path)  # before the run, not after hours of it
    require("--health-every", args.health_every, "count")
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
            base = asdict(checkpoint.train_config())
            if given.get("tokens", base["tokens"]) != base["tokens"]:
                raise SmallemError(f"checkpoint {args.resume!r} was trained on {base['tokens']} "
                                   f"and continues on them: drop --tokens {given['tokens']} (a run "
                                   f"on {given['tokens']} starts without --resume)")
        model = given.get("model", base.get("model", TrainConfig.model))
        sizes = sizes_of(model, sized, base.get("sizes") if base.get("model") == model else None)
        config = TrainConfig(**{**base, **given, "sizes": sizes})
    except SmallemError as error:
        raise SmallemError(as_typed(str(error))) from None
    if config.optimizer == "sgd" and "weight_decay" in given:
        raise SmallemError("--weight-decay applies to AdamW only (SGD here has no decay): "
                           "drop it, or use --optimizer adamw")
    monitor = None
    try:
        if args.health and not _quiet_rank():  # rank 0's file alone
            from ..training.config import build_model
            from ..training.health import HealthMonitor

            # A model built the same way names the parameters; the run builds its own.
            monitor = HealthMonitor(args.health_every, build_model(config, "cpu64"),
                                    sink=args.health)
        # A bar on a terminal; in a redirected log, the log lines alone (a bar there is
        # thousands of carriage-return updates).
        result = train(config, resume=checkpoint, save=save, observer=monitor,
                       progress=sys.stderr.isatty())
    except MemoryError as error:
        raise SmallemError(f"out of memory ({str(error) or 'MemoryError'}): ask for less, e.g. "
                           f"{_smaller(config)}") from None
    finally:
        if monitor is not None:
            monitor.close()
    if _quiet_rank():  # rank 0 reports, writes and samples
        return 0 if result.diverged_at is None else 1
    gain = result.bigram_held_out_loss - result.held_out_loss
    print(f"held-out loss {result.held_out_loss:.4f} after {result.steps} steps, "
          f"{abs(gain):.4f} nats {'below' if gain >= 0 else 'above'} the closed-form bigram "
          f"({result.bigram_held_out_loss:.4f}); initial loss {result.initial_loss:.4f}; "
          f"{result.steps_per_second:.1f} steps/s on {result.backend}" + score_text(result))
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
        print("sample:", shown(sample(result.model, "", 200, 0.8, config.seed,
                                      tokenizer=run_tokenizer(result))))
    # Exit 1 when the run diverged or its checkpoint is not where it was asked to go.
    kept = save is None or result.checkpoint == str(destination(save))
    return 0 if result.diverged_at is None and kept else 1


# Control characters a terminal would obey (ESC starts an escape sequence, ^C, ^V...) written
# as escapes, as the byte and token models' samples both are; newline and tab kept.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (9, 10)}


def shown(text: str) -> str:
    """A sample as the terminal may show it: its control characters written as escapes."""
    return text.translate(_CONTROLS)


MOST_BYTES = 1_000_000  # sample --bytes: past it, a run of hours that prints nothing until its end


def _sample(args: argparse.Namespace) -> int:
    from ..training.generate import load_model, sample
    from ..training.tokenized import tokenizer_of

    if args.bytes > MOST_BYTES:  # checked before the model loads
        raise SmallemError(f"--bytes {args.bytes:,}: give at most {MOST_BYTES:,} (the text is printed once "
                           "every byte is drawn, about a thousand a second on a CPU)")
    model, checkpoint = load_model(args.checkpoint, args.backend)
    # A byte-level model takes any bytes: a prompt that is not UTF-8 reaches Python as lone
    # surrogates (PEP 383), which give back the bytes typed.
    prompt = args.prompt.encode("utf-8", "surrogateescape")
    text = sample(model, prompt, args.bytes, args.temperature, args.seed, tokenizer=tokenizer_of(checkpoint))
    print(shown(prompt.decode("utf-8", "replace") + text))
    return 0


def _checks(args: argparse.Namespace) -> int:
    from ..training.checks import format_checks, run_checks
    from .token_options import checks_inputs

    def announce(name: str) -> None:  # a line as each starts: a CPU's Transformer checks take long
        print(f"smallem checks: {name} ({args.model}, default sizes)...", file=sys.stderr,
              flush=True)

    # the corpus as ids on --tokens bpe
    results = run_checks(args.backend, *checks_inputs(args), announce=announce)
    print(format_checks(results))
    return 1 if any(r.status == "fail" for r in results) else 0


def _bench(args: argparse.Namespace) -> int:
    from ..files import check_distinct
    from .bench import main as bench

    if args.ranks is not None:  # the data-parallel step's split (bench_ranks.py)
        from .bench_ranks import main as bench_ranks

        _check_output("--json", args.json)
        return bench_ranks(args.ranks, args.model, args.batch, args.steps, args.warmup, args.json)
    if not (1 <= args.block <= args.steps) or args.warmup < 0:
        raise SmallemError(f"--steps ({args.steps}) must be at least --block ({args.block}), "
                           f"--block at least 1 and --warmup ({args.warmup}) 0 or more")
    check_distinct({"--json": args.json}, {"--corpus": args.corpus})
    _check_output("--json", args.json)
    if args.attention:  # attention alone, then the Transformer step at long contexts (#29)
        from .bench_attention import main as bench_attention
        return bench_attention(json_path=args.json, torch=not args.no_torch)
    if args.precision is not None or args.sizes:  # smallem and PyTorch in each precision (bench_precision.py)
        from ..backends.precision import PRECISIONS
        from .bench_precision import main as bench_precision

        asked = "fp32,tf32,bf16" if args.precision is None else args.precision  # "" is no list
        chosen = [p.strip() for p in asked.split(",") if p.strip()]
        unknown = [p for p in chosen if p not in PRECISIONS]
        if unknown or not chosen:
            raise SmallemError(f"--precision {args.precision!r}: give a comma-separated list of "
                               f"{', '.join(PRECISIONS)} (e.g. fp32,tf32,bf16)")
        return bench_precision(chosen, args.sizes, args.corpus, args.json)
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


def _notebooks(args: argparse.Namespace) -> int:
    import shlex

    from .notebooks import copy_notebooks, shipped

    for line in copy_notebooks(args.folder):
        print(line)
    print(f"the {len(shipped())} notebooks are in {args.folder}: open them with "
          f"`jupyter lab {shlex.quote(args.folder)}`")
    return 0


# what each subcommand's `run` names
COMMANDS = {"gradcheck": _gradcheck, "train": _train, "sample": _sample, "checks": _checks,
            "bench": _bench, "figures": _figures, "notebooks": _notebooks}

# What to ask less of when memory runs out (train names the option that asked the most).
SMALLER = {"train": "a smaller --batch", "figures": "a smaller --batch", "sample": "fewer --bytes",
           "bench": "a smaller corpus"}


def _tolerant_streams() -> None:
    """A terminal that cannot show a byte (an ASCII-only locale, a file name that is not UTF-8)
    gets an escape for it, never a UnicodeEncodeError after the work is done."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and getattr(stream, "errors", None) == "strict":
            stream.reconfigure(errors="backslashreplace")


def _quiet_rank() -> bool:
    """Whether this process is a rank other than 0 of a run mpiexec started: it stays silent."""
    from ..ranks.world import launched

    if not launched():
        return False
    from ..ranks import world

    return world().rank != 0


def _load_compiled_kernels(args: argparse.Namespace) -> None:
    """The float32 CPU's compiled kernels' module (numba, `smallem[fast]`: half a second of
    imports), loaded before Ctrl-C is handed back to Python: a KeyboardInterrupt raised inside
    importlib's own callbacks is printed as "Exception ignored" with a traceback, and lost.
    Whatever stops it is said when the run builds its backend (compiled.kernels)."""
    if args.command not in ("train", "bench") or getattr(args, "backend", "") in ("gpu", "cpu64"):
        return
    if os.environ.get("SMALLEM_KERNELS", "").strip().lower() == "numpy":
        return
    if importlib.util.find_spec("numba") is None:
        return
    try:
        from ..backends.cpu import compiled_kernels  # noqa: F401
    except (ImportError, RuntimeError, SmallemError):  # e.g. SMALLEM_GRAIN=0, read at team.py's import
        pass


def main(argv: Sequence[str] | None = None) -> int:
    _tolerant_streams()
    argv = sys.argv[1:] if argv is None else list(argv)
    command = ""
    try:  # Ctrl-C at any moment, the imports of the first second included, is one line
        if argv[:1] == ["--version"]:  # answered before anything heavy loads
            from .. import __version__

            print(f"smallem {__version__}")
            raise SystemExit(0)  # as argparse's version action does
        refuse_mistyped(argv)  # a typo, too, before NumPy and the training stack load
        parser = build_parser()
        if not argv:  # `smallem` alone: what it can do, not an error about a missing command
            parser.print_help(sys.stderr)
            return 2
        args, extra = parser.parse_known_args(argv)
        command = args.command
        if extra:
            refuse_unknown(parser, command, extra)
        args.argv = argv  # what --ranks starts again under mpiexec
        from .interrupt import quit_at_once

        _load_compiled_kernels(args)  # numba's seconds of loading, still under quit_at_once
        if signal.getsignal(signal.SIGINT) is quit_at_once:  # loaded: the command's own Ctrl-C
            signal.signal(signal.SIGINT, signal.default_int_handler)  # (train saves first)
        return _run(args)
    except KeyboardInterrupt as error:  # train.Interrupted says what was saved
        if not _quiet_rank():
            print(f"smallem{' ' + command if command else ''}: {str(error) or 'interrupted'}",
                  file=sys.stderr)
        return 128 + int(getattr(error, "signum", 2))


def _run(args: argparse.Namespace) -> int:
    from .options import use_threads

    previous = warnings.showwarning

    def show(message, category, *rest):  # noqa: ANN001, ANN002
        if not issubclass(category, SmallemWarning):
            return previous(message, category, *rest)
        if _quiet_rank():  # every rank would say the same: rank 0 says it
            return None
        print(f"smallem {args.command}: warning: {message}", file=sys.stderr)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", SmallemWarning)
            # NumPy's overflow warnings of a diverging run: train says it in one sentence
            warnings.filterwarnings("ignore", r"(overflow|invalid value|divide by zero) "
                                    "encountered", RuntimeWarning)
            warnings.showwarning = show
            use_threads(args)  # --threads N: SMALLEM_THREADS for this run and its processes
            return COMMANDS[args.run](args)
    except SmallemError as error:
        if not getattr(error, "quiet", False):
            print(f"smallem {args.command}: error: {error}", file=sys.stderr)
        return 2
    except MemoryError as error:
        print(f"smallem {args.command}: error: out of memory ({str(error) or 'MemoryError'}): ask for "
              f"less, e.g. {SMALLER.get(args.command, 'smaller sizes')}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

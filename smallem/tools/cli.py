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
from .options import add_config_options, as_typed, choice_names, sizes_of


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


def _train(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..files import check_distinct, destination
    from ..training.config import TrainConfig, config_from
    from ..training.generate import sample
    from ..training.loop import train
    from .token_options import run_tokenizer, score_text

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
        sizes = sizes_of(model, sized, base.get("sizes") if base.get("model") == model else None)
        config = TrainConfig(**{**base, **given, "sizes": sizes})
    except SmallemError as error:
        raise SmallemError(as_typed(str(error))) from None
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
        print("sample:", sample(result.model, "", 200, 0.8, config.seed, tokenizer=run_tokenizer(result)))
    # Exit 1 when the run diverged or its checkpoint is not where it was asked to go.
    kept = save is None or result.checkpoint == str(destination(save))
    return 0 if result.diverged_at is None and kept else 1


def _sample(args: argparse.Namespace) -> int:
    from ..training.generate import load_model, sample
    from ..training.tokenized import tokenizer_of

    model, checkpoint = load_model(args.checkpoint, args.backend)
    # A byte-level model takes any bytes: a prompt that is not UTF-8 reaches Python as lone
    # surrogates (PEP 383), which give back the bytes typed.
    prompt = args.prompt.encode("utf-8", "surrogateescape")
    text = sample(model, prompt, args.bytes, args.temperature, args.seed, tokenizer=tokenizer_of(checkpoint))
    print(prompt.decode("utf-8", "replace") + text)
    return 0


def _checks(args: argparse.Namespace) -> int:
    from ..training.checks import format_checks, run_checks
    from .token_options import checks_inputs

    results = run_checks(args.backend, *checks_inputs(args))  # the corpus as ids on --tokens bpe
    print(format_checks(results))
    return 1 if any(r.status == "fail" for r in results) else 0


def _bench(args: argparse.Namespace) -> int:
    from .bench import main as bench

    if not (1 <= args.block <= args.steps) or args.warmup < 0:
        raise SmallemError(f"--steps ({args.steps}) must be at least --block ({args.block}), "
                           f"--block at least 1 and --warmup ({args.warmup}) 0 or more")
    _check_output("--json", args.json)
    if args.attention:  # attention alone, then the Transformer step at long contexts (#29)
        from .bench_attention import main as bench_attention
        return bench_attention(json_path=args.json, torch=not args.no_torch)
    if args.precision or args.sizes:  # smallem and PyTorch in each precision (bench_precision.py)
        from ..backends.precision import PRECISIONS
        from .bench_precision import main as bench_precision

        chosen = [p.strip() for p in (args.precision or "fp32,tf32,bf16").split(",") if p.strip()]
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


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from ..backends import BACKEND_NAMES, DEFAULT_BACKEND
    from . import bench

    parser = argparse.ArgumentParser(prog="smallem", description=DESCRIPTION, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"smallem {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    backends = choice_names(BACKEND_NAMES)

    p = sub.add_parser("gradcheck", help="check every primitive and operation by finite differences")
    p.add_argument("--backend", default="cpu64", metavar=backends,
                   help="cpu64 (default): finite differences in float64 "
                   "at 1e-6; cpu or gpu (float32): their tape gradients against cpu64's at 1e-4")
    p.add_argument("--precision", metavar="{fp32,tf32,bf16,fp16}", help="matrix inputs in this "
                   "format (cpu64 becomes cpu): gradients against cpu64's to 8 eps of the format")
    p.set_defaults(run=_gradcheck)

    from ..training.checks import checked_models
    from ..training.config import HEALTH_EVERY, TrainConfig
    from .token_options import add_token_options

    p = sub.add_parser("train", help="train the byte MLP (or the bigram, or a Transformer) and "
                       "report held-out loss")
    add_config_options(p)
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
    add_token_options(p).set_defaults(run=_checks)

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
    p.add_argument("--attention", action="store_true", help="attention alone (fused, unfused, "
                   "SDPA), time and memory; then the Transformer step at T 512 and 1,024")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument("--no-cpu64", action="store_true", help="leave the float64 rows out")
    p.add_argument("--corpus", help="a text file or folder (default: the standard library)")
    p.add_argument("--json", metavar="FILE", help="write the table as JSON there")
    p.add_argument("--precision", metavar="LIST", help="GPU: smallem captured in each precision "
                   "of LIST (fp32,tf32,bf16,fp16) against PyTorch in the same one, MLP and "
                   "Transformer (default with --sizes: fp32,tf32,bf16)")
    p.add_argument("--sizes", action="store_true", help="with --precision: also the Transformer "
                   "at 2x512, 8x128 and 8x512 (T 256), with TFLOP/s and the share of the peak")
    p.set_defaults(run=_bench)

    from ..training.config import BATCH
    from .figures import FIGURES, STEPS

    p = sub.add_parser("figures", help="redraw the PNGs of figures/ (fixed seeds: same bytes)")
    p.add_argument("--out", default="figures", metavar="DIR", help="where (default figures/)")
    p.add_argument("--only", nargs="+", metavar="NAME", help=f"some of {choice_names(FIGURES)}")
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

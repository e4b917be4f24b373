"""The parser of `smallem`'s command line: one subcommand per tool (`smallem train`'s options
derived in options.py), and a mistyped option answered with the command's usage and the nearest
option it has. cli.py runs what it parses: each subcommand's `run` names its command there.
"""

from __future__ import annotations

import argparse

from .options import add_config_options, choice_names

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
    p.set_defaults(run="gradcheck")

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
    p.add_argument("--ranks", type=int, metavar="N", help="data parallel: N processes started "
                   "by mpiexec (needs smallem[ranks]), each on its rows of every batch; the same "
                   "run as one process (the same under `mpiexec -n N smallem train`)")
    p.set_defaults(run="train")

    p = sub.add_parser("sample", help="generate bytes from a checkpoint")
    p.add_argument("--checkpoint", required=True, metavar="FILE")
    p.add_argument("--prompt", default="", help="text to continue (default: a new document)")
    p.add_argument("--bytes", type=int, default=200, help="how many bytes to generate")
    p.add_argument("--temperature", type=float, default=1.0, help="0: always the likeliest")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default=DEFAULT_BACKEND, metavar=backends,
                   help=f"{DEFAULT_BACKEND} (default, as load_model), cpu, cpu64 or gpu")
    p.set_defaults(run="sample")

    p = sub.add_parser("checks", help="initial loss, overfit one batch, CPU vs GPU agreement")
    p.add_argument("--backend", default="auto", metavar=backends,
                   help="auto (default), cpu, cpu64 or gpu")
    p.add_argument("--corpus", help="a text file or folder (default: the standard library)")
    p.add_argument("--model", default="mlp", choices=checked_models(),
                   help="which model's default sizes to check (default mlp)")
    add_token_options(p).set_defaults(run="checks")

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
    p.add_argument("--ranks", type=int, metavar="N", help="the data-parallel step on N CPU "
                   "ranks (mpiexec): its time split into compute and all-reduce, plain order "
                   "against overlap (--model's default sizes, --batch the global batch)")
    p.add_argument("--batch", type=int, help="with --ranks: the global batch (default: the "
                   "model's)")
    p.add_argument("--sizes", action="store_true", help="with --precision: also the Transformer "
                   "at 2x512, 8x128 and 8x512 (T 256), with TFLOP/s and the share of the peak")
    p.set_defaults(run="bench")

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
    p.set_defaults(run="figures")
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def refuse_unknown(parser: argparse.ArgumentParser, command: str, extra: list[str]) -> None:
    """An option the command does not have: its own usage, and the nearest option it has
    (`--stpes` → did you mean --steps?). Exits with status 2, as argparse does."""
    import difflib

    sub = _subparsers(parser)[command]
    known = [o for a in sub._actions for o in a.option_strings if o.startswith("--")]
    typed = next((e.split("=", 1)[0] for e in extra if e.startswith("-")), extra[0])
    near = difflib.get_close_matches(typed, known, n=1, cutoff=0.6)
    sub.error(f"unrecognized argument {typed!r}" + (f": did you mean {near[0]}?" if near else
              f"; `smallem {command} --help` lists the options"))

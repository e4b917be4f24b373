"""What the command line says and takes about tokens (`smallem train --tokens bpe`, `smallem
checks --tokens bpe`, `smallem sample` of a token run): the bits-per-byte line, the run's
tokenizer, and the checks' token options. cli.py calls these; training/tokenized.py does the work.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..training.config import BPE_VOCAB, TOKENS, TrainConfig
from ..training.tokenized import prepare


def run_tokenizer(result: Any) -> Any:
    """A finished run's tokenizer (its corpus's, on --tokens bpe), else None: bytes."""
    return getattr(result.corpus, "tokenizer", None)


def score_text(result: Any) -> str:
    """What `smallem train` adds after its held-out line: bits per byte ("" if it diverged)."""
    score = result.bits_per_byte
    if score is None:
        return ""
    unit = "tokens" if run_tokenizer(result) is not None else "bytes"
    return (f"\nbits per byte {score['bits_per_byte']:.4f} on the first {score['bytes']:,} held-out "
            f"bytes ({score['targets']:,} {unit} predicted, {score['nats_per_target']:.4f} nats each)")


def add_token_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`smallem checks`'s --tokens, --vocab and --merges, as `smallem train` has them."""
    parser.add_argument("--tokens", default="bytes", metavar="{" + ",".join(TOKENS) + "}",
                        help="what the model reads: bytes (default), or bpe tokens (initial loss ln V)")
    parser.add_argument("--vocab", type=int, help=f"with --tokens bpe: the vocabulary's size "
                        f"(default {BPE_VOCAB:,})")
    parser.add_argument("--merges", metavar="FILE", help="with --tokens bpe: a merges file written by "
                        "smallem")
    return parser


def checks_inputs(args: argparse.Namespace) -> tuple[Any, str, Any]:
    """run_checks's corpus, model and sizes from `smallem checks`'s options: the corpus as ids
    and the sizes with their vocabulary on --tokens bpe (merges learnt or read as for train)."""
    config = TrainConfig(model=args.model, tokens=args.tokens, vocab=args.vocab, merges=args.merges,
                         corpus=args.corpus)
    return prepare(config, log=print), args.model, config.sizes

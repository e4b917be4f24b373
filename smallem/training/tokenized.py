"""A run on BPE tokens (`smallem train --tokens bpe`): the merges it uses (a --merges file, the
checkpoint's, or learnt once from the training part and cached), the corpus as ids, the merges a
checkpoint carries and is checked against, and a run's bits per byte on its held-out bytes. The
loop and the CLI call it; tokens.py holds the tokenizer, bpb.py the score.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..data import Corpus, load_corpus
from ..errors import SmallemError
from ..tokens import FIRST_MERGE, Tokenizer, check_merges, load_merges, save_merges, train
from .bpb import Score, bits_per_byte, held_out_span

CACHE = "SMALLEM_CACHE"  # where learnt merges are kept; else $XDG_CACHE_HOME/smallem, ~/.cache/smallem


def cache_folder() -> Path:
    if os.environ.get(CACHE):
        return Path(os.path.expanduser(os.environ[CACHE]))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "smallem"


@dataclass
class TokenCorpus(Corpus):
    """A corpus as ids: `train` and `held_out` are its byte streams encoded, `byte_held_out`
    the bytes themselves (bits per byte is scored on them)."""

    tokenizer: Tokenizer | None = None
    byte_held_out: np.ndarray | None = None

    def fingerprint(self) -> dict[str, Any]:
        merges = np.array(self.tokenizer.merges, dtype=np.int64).tobytes()
        return {**super().fingerprint(), "vocab": self.tokenizer.vocab, "merges_crc32": zlib.crc32(merges)}


def merges_for(corpus: Corpus, vocab: int, path: str | None = None,
               log: Callable[[str], Any] | None = None) -> tuple[list, str]:
    """The merges of a `vocab`-id tokenizer for `corpus`: read from `path`, or from the cache,
    or learnt from the training part (and cached). Returns them and where they are."""
    if path is not None:
        merges = load_merges(path)
        if FIRST_MERGE + len(merges) != vocab:
            raise SmallemError(f"merges file {path!r} holds {len(merges)} merges, a vocabulary of "
                               f"{FIRST_MERGE + len(merges)}, not --vocab {vocab}: leave --vocab "
                               "out or pass the merges of that size")
        return merges, str(path)
    tag = zlib.crc32(corpus.train.tobytes())
    cached = cache_folder() / "merges" / f"{tag:08x}-{vocab}.json"
    try:
        known = cached.is_file()
    except OSError:  # a $SMALLEM_CACHE too long to look up (Python 3.11): learnt, then not cached
        known = False
    if known:
        try:
            merges = load_merges(cached)
            if FIRST_MERGE + len(merges) == vocab:
                return merges, str(cached)
        except SmallemError:
            pass  # a damaged cache entry: learn them again and replace it
    merges = _learn(corpus, vocab, log)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        save_merges(cached, merges)
        where = f"cached in {cached}"
    except (OSError, SmallemError) as error:  # costs the next run the learning again, no more
        why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        where = f"not cached ({cache_folder()} cannot hold them: {why}; ${CACHE} names the folder)"
    if log is not None:
        log(f"learnt {len(merges)} merges from the training part in {merges.seconds:.1f} s, {where}")
    return merges, str(cached)


class _Merges(list):
    """Merges, with the seconds they took to learn."""

    seconds = 0.0


def _learn(corpus: Corpus, vocab: int, log: Callable[[str], Any] | None) -> _Merges:
    """Merges learnt from the training part: a line before (it takes a while on a large
    corpus), and a bar on a terminal or in a notebook while they are learnt."""
    from .bar import progress_bar

    if log is not None:
        log(f"learning {vocab - FIRST_MERGE:,} BPE merges from the training part "
            f"({corpus.train.size:,} bytes; once: they are cached)")
    started = time.perf_counter()
    with progress_bar(total=vocab - FIRST_MERGE, desc="BPE merges", unit="merge", leave=False,
                      disable=None if log is not None else True) as bar:
        merges = _Merges(train(corpus.train, vocab, progress=lambda done, _: bar.update(done - bar.n)))
    merges.seconds = time.perf_counter() - started
    if FIRST_MERGE + len(merges) < vocab:
        raise SmallemError(f"the training part runs out of pairs to merge after {len(merges)} "
                           f"merges: ask for --vocab {FIRST_MERGE + len(merges)} or fewer, or "
                           "use a larger corpus")
    return merges


def tokenize(corpus: Corpus, tokenizer: Tokenizer) -> TokenCorpus:
    """`corpus` with its two streams encoded (uint16 holds up to 65,536 ids)."""
    if tokenizer.vocab > 2 ** 16:
        raise SmallemError(f"a vocabulary of {tokenizer.vocab} ids does not fit the corpus's "
                           "16-bit streams: ask for 65,536 or fewer")
    return TokenCorpus(f"{corpus.source} as {tokenizer.vocab} BPE ids", corpus.names,
                       tokenizer.encode(corpus.train).astype(np.uint16),
                       tokenizer.encode(corpus.held_out).astype(np.uint16), corpus.held_out_names,
                       tokenizer=tokenizer, byte_held_out=corpus.held_out)


def prepare(config: Any, corpus: Corpus | None = None, checkpoint: Any = None,
            log: Callable[[str], Any] | None = None) -> Corpus:
    """The corpus (None: `config.corpus`, loaded) as `config`'s model reads it: the bytes, or
    (--tokens bpe) ids of the merges the run uses; a resumed run uses its checkpoint's and
    refuses other ones."""
    corpus = corpus or load_corpus(config.corpus)
    if config.tokens == "bytes":
        return corpus
    saved = tokenizer_of(checkpoint) if checkpoint is not None else None
    if saved is not None and config.merges is None:
        return tokenize(corpus, saved)
    merges, _ = merges_for(corpus, config.sizes.vocab, config.merges, log)
    if saved is not None and saved.merges != [tuple(m) for m in merges]:
        raise SmallemError(f"the merges of {config.merges!r} are not those checkpoint "
                           f"{checkpoint.path!r} was trained with: leave --merges out to resume")
    return tokenize(corpus, Tokenizer(merges))


def tokenizer_of(checkpoint: Any) -> Tokenizer | None:
    """The tokenizer a checkpoint was trained with (None: bytes), its merges checked against
    the model's vocabulary."""
    config = checkpoint.config
    if config.get("tokens", "bytes") == "bytes":
        return None
    where = f"checkpoint {checkpoint.path!r}"
    merges = checkpoint.meta.get("merges")
    if not isinstance(merges, list):
        raise SmallemError(f"{where} was trained on BPE tokens but holds no merges: the file was "
                           "edited or damaged; use one written by `smallem train --tokens bpe`")
    check_merges(merges, where)
    vocab = (config.get("sizes") or {}).get("vocab")
    if vocab != FIRST_MERGE + len(merges):
        raise SmallemError(f"{where} holds {len(merges)} merges, a vocabulary of "
                           f"{FIRST_MERGE + len(merges)}, but its model scores {vocab} ids: the "
                           "file was edited or damaged")
    return Tokenizer(merges)


def checkpoint_meta(corpus: Corpus) -> dict[str, Any]:
    """What a checkpoint of a run on `corpus` adds to its meta: the merges, on tokens."""
    tokenizer = getattr(corpus, "tokenizer", None)
    return {} if tokenizer is None else {"merges": [list(m) for m in tokenizer.merges]}


def held_out_score(model: Any, corpus: Corpus) -> Score:
    """A trained run's score on the first bpb.SPAN_BYTES of its corpus's held-out bytes, bytes
    or tokens alike (a TokenCorpus carries its bytes and its tokenizer)."""
    held = getattr(corpus, "byte_held_out", None)
    return bits_per_byte(model, held_out_span(corpus.held_out if held is None else held),
                         getattr(corpus, "tokenizer", None))

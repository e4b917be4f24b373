"""Byte-level BPE: merges learnt on the training split, encode and decode (lesson 16).

Token ids 0-255 are the bytes, 256 the document boundary (never merged, never crossed), and
257 + k the k-th merge. Text is first cut into chunks (a word with the space before it, a run
of digits, of punctuation, of whitespace) and merges never cross a chunk, so a chunk that
repeats is counted once with its count: the trainer updates pair counts incrementally.
"""

from __future__ import annotations

import heapq
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .data import BOUNDARY, VOCAB, utf8
from .errors import SmallemError, require
from .files import atomic_write, not_a_file

FIRST_MERGE = VOCAB  # 257: the id the first merge gets
FORMAT = "smallem-merges"
# A word with the one space before it; digits; punctuation; whitespace up to the last space
# before a word (which joins that word: indentation and the word after it stay two chunks).
CHUNK = re.compile(rb" ?[A-Za-z_][A-Za-z_0-9]*| ?[0-9]+| ?[^\sA-Za-z_0-9]+|\s+(?!\S)|\s+")
Pair = tuple[int, int]


def chunks(data: bytes) -> list[bytes]:
    """`data` cut where merges may not cross; the chunks join back to `data` exactly."""
    return CHUNK.findall(data)


def documents(stream: np.ndarray | bytes) -> list[bytes]:
    """A token stream of bytes and boundaries (a Corpus's train) -> its documents' bytes."""
    if isinstance(stream, (bytes, bytearray)):
        return [bytes(stream)]
    stream = np.asarray(stream)
    cuts = np.flatnonzero(stream == BOUNDARY)
    edges = np.concatenate([[-1], cuts, [stream.size]])
    return [stream[a + 1:b].astype(np.uint8).tobytes() for a, b in zip(edges[:-1], edges[1:])]


def word_counts(stream: np.ndarray | bytes) -> Counter:
    """How often each chunk occurs in `stream`, as {chunk bytes: count}."""
    counts: Counter = Counter()
    for doc in documents(stream):
        counts.update(chunks(doc))
    return counts


# the rule, as the lesson writes it ---------------------------------------------------------
def count_pairs(words: dict[tuple[int, ...], int]) -> Counter:
    """{(a, b): how often a is followed by b}, each word's pairs counted `count` times."""
    pairs: Counter = Counter()
    for word, count in words.items():
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    return pairs


def merge(word: Sequence[int], pair: Pair, new: int) -> tuple[int, ...]:
    """`word` with every (a, b) of `pair`, read left to right without overlap, replaced by `new`."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def best_pair(pairs: dict[Pair, int]) -> Pair:
    """The most frequent pair; among equals, the smallest (a, b): one answer, on every machine."""
    return min(pairs, key=lambda p: (-pairs[p], p))


def _check_vocab(vocab: int) -> int:
    require("the vocabulary size", vocab, "count")
    if vocab < VOCAB:
        raise SmallemError(f"a vocabulary of {vocab} cannot hold the 256 bytes and the boundary: "
                           f"ask for {VOCAB} or more")
    return vocab - FIRST_MERGE


def train_reference(words: dict[bytes, int], vocab: int) -> list[Pair]:
    """The slow trainer the tests and the lesson read: recount every pair after every merge."""
    current = {tuple(w): c for w, c in words.items()}
    merges: list[Pair] = []
    for k in range(_check_vocab(vocab)):
        pairs = count_pairs(current)
        if not pairs:
            break
        pair = best_pair(pairs)
        merges.append(pair)
        joined: Counter = Counter()
        for word, count in current.items():
            joined[merge(word, pair, FIRST_MERGE + k)] += count
        current = dict(joined)
    return merges


def train(words: dict[bytes, int] | np.ndarray | bytes, vocab: int, *,
          count: Callable[[dict], dict] = count_pairs,
          rewrite: Callable[[Sequence[int], Pair, int], Sequence[int]] = merge,
          progress: Callable[[int, int], Any] | None = None) -> list[Pair]:
    """Merges for a vocabulary of `vocab` ids, learnt from chunk counts (or a token stream).

    Same merges as `train_reference`, counted incrementally as Hugging Face's tokenizers do: a
    merge visits only the places that hold its pair and changes only their neighbours' counts, so
    a long chunk (a file with no spaces) costs what its merges touch, not its length per merge.
    A heap finds the best pair; an entry whose count is stale is dropped when it surfaces.
    `count` makes the first counts and `rewrite` every word's merge (lesson 16 passes the
    learner's, which rewrite whole words); `progress(done, total)` is called after each merge."""
    if not isinstance(words, dict):
        words = word_counts(words)
    n_merges = _check_vocab(vocab)
    pairs: dict[Pair, int] = {p: c for p, c in count({tuple(w): c for w, c in words.items()}).items()
                              if c > 0}
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    apply = (_Symbols(words) if rewrite is merge else _Words(words, rewrite)).apply
    merges: list[Pair] = []
    while len(merges) < n_merges and heap:
        negative, pair = heapq.heappop(heap)
        if pairs.get(pair, 0) != -negative or negative == 0:
            continue  # stale: the count changed since this entry was pushed
        merges.append(pair)
        changed = apply(pair, FIRST_MERGE + len(merges) - 1, pairs)
        pairs.pop(pair, None)
        for p in changed:
            if p != pair and pairs.get(p, 0) > 0:
                heapq.heappush(heap, (-pairs[p], p))
        if progress is not None:
            progress(len(merges), n_merges)
    return merges


class _Symbols:
    """Every word's symbols in one doubly linked list (a word's count on each of its symbols),
    with where each pair starts: a merge rewrites only those places, left to right."""

    def __init__(self, words: dict[bytes, int]) -> None:
        self.symbol: list[int] = []
        self.weight: list[int] = []
        self.next: list[int] = []  # -1: the word ends here
        self.prev: list[int] = []
        self.where: dict[Pair, list[int]] = {}
        for word, count in words.items():
            first = len(self.symbol)
            for k, b in enumerate(word):
                self.symbol.append(b)
                self.weight.append(count)
                self.prev.append(first + k - 1 if k else -1)
                self.next.append(first + k + 1 if k + 1 < len(word) else -1)
                if k:
                    self.where.setdefault((word[k - 1], b), []).append(first + k - 1)

    def apply(self, pair: Pair, new: int, pairs: dict[Pair, int]) -> set[Pair]:
        """Merge `pair` into `new` wherever it still stands; update `pairs`; the pairs changed."""
        a, b = pair
        symbol, nxt, prev, weight = self.symbol, self.next, self.prev, self.weight
        changed: set[Pair] = set()

        def add(p: Pair, at: int, count: int) -> None:
            pairs[p] = pairs.get(p, 0) + count
            changed.add(p)
            if count > 0:
                self.where.setdefault(p, []).append(at)

        for i in sorted(set(self.where.pop(pair, ()))):  # in order: (a, a) runs merge left to right
            j = nxt[i]
            if symbol[i] != a or j < 0 or symbol[j] != b:
                continue  # stale: an earlier merge changed this place
            w = weight[i]
            if prev[i] >= 0:
                left = symbol[prev[i]]
                add((left, a), prev[i], -w)
                add((left, new), prev[i], w)
            k = nxt[j]
            if k >= 0:
                add((b, symbol[k]), j, -w)
                add((new, symbol[k]), i, w)
                prev[k] = i
            symbol[i], nxt[i] = new, k
            symbol[j] = -1  # gone: a later place that starts here is stale
        return changed


class _Words:
    """Words rewritten whole by `rewrite` (the learner's merge in lesson 16): after a merge only
    the words holding the pair are rewritten, and only their pairs' counts change."""

    def __init__(self, words: dict[bytes, int],
                 rewrite: Callable[[Sequence[int], Pair, int], Sequence[int]]) -> None:
        self.seqs = [list(w) for w in words]
        self.counts = list(words.values())
        self.rewrite = rewrite
        self.where: dict[Pair, set[int]] = {}
        for w, seq in enumerate(self.seqs):
            for pair in zip(seq, seq[1:]):
                self.where.setdefault(pair, set()).add(w)

    def apply(self, pair: Pair, new: int, pairs: dict[Pair, int]) -> set[Pair]:
        changed: set[Pair] = set()
        for w in self.where.pop(pair, ()):
            old, count = self.seqs[w], self.counts[w]
            seq = list(self.rewrite(tuple(old), pair, new))
            for p in zip(old, old[1:]):
                pairs[p] -= count
                changed.add(p)
            for p in zip(seq, seq[1:]):
                pairs[p] = pairs.get(p, 0) + count
                self.where.setdefault(p, set()).add(w)
                changed.add(p)
            for p in set(zip(old, old[1:])) - set(zip(seq, seq[1:])):
                if p != pair:
                    self.where[p].discard(w)
            self.seqs[w] = seq
        return changed


# encode and decode -------------------------------------------------------------------------
class Tokenizer:
    """Merges applied in the order learnt. `encode` takes text, bytes or a stream of bytes and
    boundaries; `decode` gives that stream back exactly, `decode_bytes` the bytes."""

    def __init__(self, merges: Iterable[Sequence[int]],
                 encode_chunk: Callable[[bytes, dict[Pair, int]], Sequence[int]] | None = None
                 ) -> None:
        self._encode = encode_chunk  # lesson 16: the learner's, given (chunk, rank)
        if isinstance(merges, (str, bytes, os.PathLike)):
            raise SmallemError(f"Tokenizer takes the merges, pairs of ids, got {type(merges).__name__} "
                               f"{str(merges)[:40]!r}: read a merges file with "
                               "Tokenizer(load_merges(path)), or learn them with train(text, vocab)")
        merges = [tuple(m) if isinstance(m, np.ndarray) else m for m in merges]
        check_merges(merges, "the merges")
        self.merges = [(int(a), int(b)) for a, b in merges]
        self.rank = {pair: k for k, pair in enumerate(self.merges)}
        self.pieces = [bytes([b]) for b in range(256)] + [b""]  # the boundary has no bytes
        for a, b in self.merges:
            self.pieces.append(self.pieces[a] + self.pieces[b])
        self._cache: dict[bytes, list[int]] = {}

    @property
    def vocab(self) -> int:
        return FIRST_MERGE + len(self.merges)

    def encode_chunk(self, chunk: bytes) -> list[int]:
        """One chunk's ids: the pair of lowest rank merged everywhere, until none is left
        (the same as applying every merge in the order learnt)."""
        if chunk in self._cache:
            return self._cache[chunk]
        if self._encode is not None:
            self._cache[chunk] = [int(i) for i in self._encode(chunk, self.rank)]
            return self._cache[chunk]
        word: tuple[int, ...] = tuple(chunk)
        while len(word) > 1:
            pair = min(zip(word, word[1:]), key=lambda p: self.rank.get(p, len(self.rank)))
            if pair not in self.rank:
                break
            word = merge(word, pair, FIRST_MERGE + self.rank[pair])
        if len(self._cache) < 1_000_000:  # a bound: arbitrary input cannot fill memory
            self._cache[chunk] = list(word)
        return list(word)

    def encode(self, data: str | bytes | np.ndarray) -> np.ndarray:
        """Text (UTF-8), bytes, or a stream of byte tokens and boundaries -> ids, int64."""
        if isinstance(data, str):
            data = utf8(data, "Tokenizer.encode")
        if isinstance(data, (bytes, bytearray)):
            docs, starts = [bytes(data)], False
        else:
            stream = np.asarray(data)
            if stream.size and (stream.min() < 0 or stream.max() > BOUNDARY):
                raise SmallemError("encode takes bytes (0-255) and boundaries (256); got a token "
                                   f"{int(stream.max() if stream.max() > BOUNDARY else stream.min())}")
            docs, starts = documents(stream), True
        out: list[int] = []
        for k, doc in enumerate(docs):
            if starts and k:
                out.append(BOUNDARY)
            for chunk in chunks(doc):
                out.extend(self.encode_chunk(chunk))
        return np.array(out, dtype=np.int64)

    def ids(self, ids: Sequence[int] | np.ndarray) -> list[int]:
        """ids as a list of ints, each checked to be in the vocabulary."""
        given = np.asarray(ids)
        if given.dtype.kind not in "iu" and given.size:  # 2.5 or "7" would be cut to an id silently
            whole = given.dtype.kind == "f" and bool(np.all(given == np.round(given)))
            if not whole:
                odd = next(i for i in given.reshape(-1).tolist()
                           if not isinstance(i, (int, float)) or i != round(i))
                raise SmallemError(f"decode: the ids must be whole numbers, got {odd!r}: pass the "
                                   "ids encode gave")
        out = given.astype(np.int64).reshape(-1).tolist()
        bad = next((i for i in out if not 0 <= i < self.vocab), None)
        if bad is not None:
            raise SmallemError(f"decode: id {bad} is outside the vocabulary of {self.vocab} "
                               "ids: decode with the merges these ids were encoded with")
        return out

    def decode(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """ids -> the stream of byte tokens and boundaries they stand for, int64."""
        checked = self.ids(ids)
        parts = [self.pieces[i] if i != BOUNDARY else b"\x00" for i in checked]
        stream = np.frombuffer(b"".join(parts), np.uint8).astype(np.int64)
        # each boundary stood in as one placeholder byte: put the boundaries back at their places
        lengths = np.array([len(p) for p in parts], dtype=np.int64)
        at = np.cumsum(lengths) - 1
        boundary = np.array([i == BOUNDARY for i in checked], dtype=bool)
        stream[at[boundary]] = BOUNDARY
        return stream

    def decode_bytes(self, ids: Sequence[int] | np.ndarray) -> bytes:
        """ids -> bytes (a boundary has none)."""
        return b"".join(self.pieces[i] for i in self.ids(ids))

    def piece(self, i: int) -> str:
        """One token's bytes, readable: what a table of the vocabulary shows."""
        return "<|endoftext|>" if i == BOUNDARY else self.pieces[i].decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"Tokenizer({self.vocab} ids: 256 bytes, the boundary, {len(self.merges)} merges)"


# merges on disk ----------------------------------------------------------------------------
def check_merges(merges: Sequence[Sequence[int]], where: str) -> None:
    """Each merge joins two ids that exist before it and neither is the boundary."""
    for k, pair in enumerate(merges):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise SmallemError(f"{where}: merge {k} is {list(pair)!r}, not a pair of ids")
        for i in pair:
            if (not isinstance(i, (int, np.integer)) or isinstance(i, bool)
                    or not 0 <= i < FIRST_MERGE + k or i == BOUNDARY):
                raise SmallemError(f"{where}: merge {k} joins {i!r}, which is not a byte nor an "
                                   f"earlier merge (0-255 or 257-{FIRST_MERGE + k - 1}); use "
                                   "merges written by smallem")


def save_merges(path: str | os.PathLike, merges: Sequence[Sequence[int]]) -> Path:
    """Write merges as JSON, atomically."""
    text = json.dumps({"format": FORMAT, "version": 1, "merges": [list(map(int, p)) for p in merges]})
    return atomic_write(path, lambda fh: fh.write(text.encode()), what="merges file")


def load_merges(path: str | os.PathLike) -> list[Pair]:
    """Read merges written by `save_merges`; anything else is one sentence."""
    where = f"merges file {str(path)!r}"
    kind = not_a_file(path)
    if kind is not None:
        raise SmallemError(f"{where} is {kind}, not a regular file: pass a merges file written by "
                           "smallem")
    try:
        saved = json.loads(Path(path).expanduser().read_bytes())
    except FileNotFoundError:
        raise SmallemError(f"{where} does not exist: pass a file written by smallem, or leave "
                           "--merges out to learn merges from the corpus") from None
    except (OSError, ValueError, RecursionError) as error:  # RecursionError: JSON nested too deep
        why = error.strerror if isinstance(error, OSError) else "it is not JSON"
        raise SmallemError(f"{where} cannot be read ({why}): pass a file written by smallem") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT or not isinstance(
            saved.get("merges"), list):
        raise SmallemError(f"{where} is not a smallem merges file (no \"format\": \"{FORMAT}\" "
                           "and list of merges): pass a file written by smallem")
    check_merges(saved["merges"], where)
    return [(int(a), int(b)) for a, b in saved["merges"]]

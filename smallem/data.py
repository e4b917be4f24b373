"""Data: bytes in, tokens out, and batches for the training loop, all on the host.

Tokens 0-255 are the bytes of the text and token 256 marks a document boundary (257 tokens).
The default corpus is the Python standard library's own sources: no download, ever. Batches
are drawn by one seeded NumPy generator, so every backend sees the same batches and a run
resumes exactly from the generator's saved state.
"""

from __future__ import annotations

import math
import os
import stat
import sysconfig
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import SmallemError, SmallemWarning
from .files import look_up

VOCAB = 257  # 256 byte values + the boundary token
BOUNDARY = 256  # marks where one document ends and the next begins
CONTEXT = 16  # bytes the model sees before predicting the next one
DEFAULT_CORPUS_BYTES = 8_000_000  # caps the default corpus so it loads in well under a second
HELD_OUT_FRACTION = 0.10
MIN_CORPUS_BYTES = 1024  # below this there is nothing to split and sample from
# Folders of the standard library left out of the default corpus: tests read like fixtures,
# and the codec tables of `encodings` are generated, not written by people.
SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__",
                "encodings"}


# tokenizer ---------------------------------------------------------------------------------
def utf8(text: str, who: str = "encode") -> bytes:
    """Text as UTF-8 bytes; the bytes a non-UTF-8 argument or file name stood for (PEP 383's
    U+DC80-U+DCFF) given back as they were; any other lone surrogate, which no UTF-8 holds, is
    one sentence."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as error:
        bad = text[error.start]
        raise SmallemError(f"{who}: the text holds a lone surrogate, U+{ord(bad):04X} at "
                           f"character {error.start}, which UTF-8 cannot hold: pass the text "
                           "without it, or bytes") from None


def encode(text: str | bytes) -> np.ndarray:
    """Text (UTF-8) or bytes -> tokens 0-255, as int64."""
    if not isinstance(text, (str, bytes, bytearray, memoryview)):
        raise SmallemError(f"encode takes text or bytes, got {type(text).__name__} {text!r}: "
                           f"write it as text, e.g. {str(text)!r}")
    data = utf8(text) if isinstance(text, str) else bytes(text)
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64)


def decode(tokens: Sequence[int] | np.ndarray, boundary: str = "<|endoftext|>") -> str:
    """Tokens -> text: bytes are decoded as UTF-8 (invalid sequences become U+FFFD), each
    boundary token becomes `boundary`."""
    parts, run = [], bytearray()
    for t in np.asarray(tokens, dtype=np.int64).reshape(-1).tolist():
        if t == BOUNDARY:
            parts.append(run.decode("utf-8", errors="replace") + boundary)
            run = bytearray()
        elif 0 <= t < BOUNDARY:
            run.append(t)
        else:
            raise SmallemError(f"decode: token {t} is not a byte (0-255) nor the boundary (256)")
    return "".join(parts) + run.decode("utf-8", errors="replace")


# corpus ------------------------------------------------------------------------------------
@dataclass
class Corpus:
    """A list of documents (name, bytes) split into a train and a held-out token stream.

    Each stream is its documents' bytes, each preceded by the boundary token, as uint16."""

    source: str  # a path, or "stdlib:<path>" for the default corpus
    names: list[str]
    train: np.ndarray  # (N,) uint16 tokens
    held_out: np.ndarray  # (M,) uint16 tokens
    held_out_names: list[str]

    @property
    def bytes(self) -> int:
        return int(self.train.size + self.held_out.size)

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint records to tell whether it is resumed on the same data."""
        return {"source": self.source, "documents": len(self.names),
                "train_tokens": int(self.train.size), "held_out_tokens": int(self.held_out.size),
                "crc32": zlib.crc32(self.train.tobytes()) ^ zlib.crc32(self.held_out.tobytes())}

    def __repr__(self) -> str:
        return (f"Corpus({self.source!r}: {len(self.names)} documents, {self.train.size:,} "
                f"train and {self.held_out.size:,} held-out tokens)")


def stdlib_documents(max_bytes: int = DEFAULT_CORPUS_BYTES) -> tuple[str, list[tuple[str, bytes]]]:
    """The standard library's .py files in sorted path order, up to `max_bytes`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")]
        paths += [Path(folder, f) for f in files if f.endswith(".py")]
    docs, total = [], 0
    for path in sorted(paths):
        data = path.read_bytes()
        if not data:  # an empty __init__.py is no document
            continue
        if total + len(data) > max_bytes:
            break
        docs.append((path.relative_to(root).as_posix(), data))
        total += len(data)
    return f"stdlib:{root}", docs


def _is_binary(data: bytes) -> bool:
    return b"\x00" in data[:8192]  # text files never hold NUL bytes; binaries nearly always do


def _why(error: OSError) -> str:
    return (error.strerror or str(error)).lower()


def folder_documents(path: str | os.PathLike, max_bytes: int | None = None
                     ) -> tuple[str, list[tuple[str, bytes]]]:
    """The text files of a file or a folder (recursively, sorted, hidden and binary files
    skipped). Inside a folder, a file or subfolder that cannot be read is skipped and named in
    a SmallemWarning; a corpus file named directly that cannot be read is an error."""
    if not os.fspath(path).strip():  # Path("") is the current folder: never what was meant
        raise SmallemError("the corpus path is empty: pass a text file or a folder of text files, "
                           "or leave --corpus out to use the standard library")
    root = Path(path).expanduser()
    kind = look_up(root, "corpus", "pass a text file or a folder of text files")
    if kind == "missing":
        raise SmallemError(f"corpus {str(root)!r} does not exist: pass a text file or a folder "
                           "of text files, or leave --corpus out to use the standard library")
    if kind not in (None, "a folder"):  # a pipe's read would wait forever, /dev/zero never end
        raise SmallemError(f"corpus {str(root)!r} is {kind}: pass a text file or a folder of text files")
    if root.is_file():
        try:
            data = root.read_bytes()
        except OSError as error:
            raise SmallemError(f"corpus file {str(root)!r} cannot be read: {_why(error)}; fix "
                               "its permissions or pass another corpus") from None
        if _is_binary(data):
            raise SmallemError(f"corpus {str(root)!r} looks binary (it holds NUL bytes): "
                               "pass a text file or a folder of text files")
        return str(root), [(root.name, data[:max_bytes])]

    def skipped(kind: str, where: str | os.PathLike, error: OSError) -> None:
        name = Path(where).relative_to(root).as_posix() if Path(where) != root else "."
        warnings.warn(f"skipped corpus {kind} {name!r}, which cannot be read: {_why(error)}; "
                      "fix its permissions to include it", SmallemWarning, stacklevel=4)

    paths = []
    for folder, dirs, files in os.walk(root, onerror=lambda e: skipped("folder", e.filename, e)):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        paths += [Path(folder, f) for f in files if not f.startswith(".")]
    docs, total, unread = [], 0, {}
    for file in sorted(paths):
        try:  # stat, not is_file(), which answers False for a file it may not look at (3.14)
            data = file.read_bytes() if stat.S_ISREG(file.stat().st_mode) else b""
        except OSError as error:
            unread.setdefault(file.parent, []).append((file, error))
            continue
        if not data or _is_binary(data):
            continue
        if max_bytes is not None and total + len(data) > max_bytes:
            break
        docs.append((file.relative_to(root).as_posix(), data))
        total += len(data)
    for folder, failures in unread.items():
        whole = folder != root and len(failures) == sum(p.parent == folder for p in paths) > 1
        if whole:  # a folder none of whose files can be read (listed, not entered): named once
            skipped("folder", folder, failures[0][1])
        else:
            for file, error in failures:
                skipped("file", file, error)
    return str(root), docs


def _stream(docs: Sequence[tuple[str, bytes]]) -> np.ndarray:
    """[256, doc₁…, 256, doc₂…, …] as uint16: the boundary opens every document."""
    out = np.empty(sum(len(d) + 1 for _, d in docs), dtype=np.uint16)
    at = 0
    for _, data in docs:
        out[at] = BOUNDARY
        out[at + 1:at + 1 + len(data)] = np.frombuffer(data, dtype=np.uint8)
        at += len(data) + 1
    return out


def load_corpus(path: str | os.PathLike | None = None, *, max_bytes: int | None = None,
                held_out: float = HELD_OUT_FRACTION) -> Corpus:
    """Load a corpus (the standard library when `path` is None) and split it.

    The split is by document and deterministic: documents taken in the order of the CRC32 of
    their name are held out until they hold `held_out` of the bytes. A corpus of fewer than
    ten documents, or one whose documents are too large to hold out even half of that whole,
    is split inside its stream instead: the last `held_out` is held out."""
    if path is None:
        source, docs = stdlib_documents(max_bytes or DEFAULT_CORPUS_BYTES)
    elif not isinstance(path, (str, os.PathLike)):  # an edited checkpoint's config
        raise SmallemError(f"the corpus must be a path to a text file or folder, got {path!r}")
    else:
        source, docs = folder_documents(path, max_bytes)
    total = sum(len(d) for _, d in docs)
    if not docs:
        raise SmallemError(f"corpus {source!r} holds no text file: pass a text file or a folder "
                           "of text files")
    if total < MIN_CORPUS_BYTES:
        raise SmallemError(f"corpus {source!r} holds only {total} bytes of text, fewer than "
                           f"{MIN_CORPUS_BYTES}: pass a larger text file or folder")
    names = [n for n, _ in docs]

    def inside_the_stream() -> Corpus:
        stream = _stream(docs)
        cut = int(len(stream) * (1 - held_out))
        return Corpus(source, names, stream[:cut], stream[cut:], [])

    if len(docs) < 10:
        return inside_the_stream()
    target = held_out * total
    chosen, taken = set(), 0
    def crc(k: int) -> int:  # a name's bytes as the file system gave them (not UTF-8 on some disks)
        return zlib.crc32(names[k].encode("utf-8", "surrogateescape"))

    for k in sorted(range(len(docs)), key=lambda k: (crc(k), k)):
        size = len(docs[k][1])
        if taken + size <= target:  # a document larger than what is left waits its turn
            chosen.add(k)
            taken += size
    if taken < target / 2:  # a few large documents: whole ones would hold out next to nothing
        return inside_the_stream()
    train = [d for k, d in enumerate(docs) if k not in chosen]
    held = [d for k, d in enumerate(docs) if k in chosen]
    return Corpus(source, names, _stream(train), _stream(held), [n for n, _ in held])


# batches -----------------------------------------------------------------------------------
def windows(tokens: np.ndarray, positions: np.ndarray, context: int = CONTEXT
            ) -> tuple[np.ndarray, np.ndarray]:
    """Contexts (B, T) and targets (B,) as int64: the `context` tokens before each position,
    and the token at it."""
    offsets = np.arange(-context, 0)
    return (tokens[positions[:, None] + offsets].astype(np.int64),
            tokens[positions].astype(np.int64))


class BatchSampler:
    """Random (contexts, targets) batches from one token stream, driven by a seeded NumPy
    generator whose state can be saved and restored for an exact resume."""

    def __init__(self, tokens: np.ndarray, batch: int, context: int = CONTEXT,
                 seed: int = 0) -> None:
        if batch < 1:
            raise SmallemError(f"batch size must be at least 1, got {batch}")
        if tokens.size <= context:
            raise SmallemError(f"{tokens.size} tokens leave no room for a context of {context} "
                               "and a target: use a larger corpus")
        self.tokens, self.batch, self.context = tokens, batch, context
        self.rng = np.random.default_rng(seed)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        positions = self.rng.integers(self.context, self.tokens.size, size=self.batch)
        return windows(self.tokens, positions, self.context)

    __next__ = next

    def __iter__(self) -> BatchSampler:
        return self

    def state(self) -> dict[str, Any]:
        """The generator's state, JSON-able (big integers included)."""
        return self.rng.bit_generator.state

    def load_state(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state


def fixed_positions(tokens: np.ndarray, batch: int, count: int, context: int = CONTEXT
                    ) -> np.ndarray:
    """`batch · count` evenly spaced positions, each with `context` tokens before it: the
    held-out targets every evaluation scores, for every run and backend, with no generator."""
    if tokens.size <= context:
        raise SmallemError(f"the held-out part has {tokens.size} tokens, too few for a "
                           f"context of {context} and a target: hold out more text (the "
                           f"corpus's held-out part is a tenth of it), or use a smaller context")
    n = batch * count
    if tokens.size - context < n:
        # Below one example per position the evaluation reads some twice, and a held-out
        # loss of a few hundred bytes says little: say so, and what would be large enough.
        enough = math.ceil((n + context) / HELD_OUT_FRACTION)
        warnings.warn(f"the held-out part holds {tokens.size - context:,} examples of {context} "
                      f"bytes and their next one, fewer than the {n:,} an evaluation reads "
                      f"({count} batches of {batch}): its loss measures little; a corpus of "
                      f"{enough:,} bytes or more (a tenth is held out) is large enough",
                      SmallemWarning, stacklevel=3)
    return np.linspace(context, tokens.size - 1, n).astype(np.int64)


def fixed_batches(tokens: np.ndarray, batch: int, count: int, context: int = CONTEXT
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """`count` batches at the fixed positions: the same held-out examples at every
    evaluation, for every run and backend, with no generator involved."""
    positions = fixed_positions(tokens, batch, count, context)
    return [windows(tokens, positions[k * batch:(k + 1) * batch], context) for k in range(count)]


# sequences: every position predicts its next byte (the Transformer) ------------------------
PAD = 10  # what stands before the stream's start: a newline, as the end of a previous document


def sequences(tokens: np.ndarray, positions: np.ndarray, context: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (B, T) and targets (B, T) as int64 ending at each position: inputs are the
    `context` tokens before it, targets the same moved by one, so the last target is the token
    at the position (the MLP's target there). Before the stream's start stands PAD."""
    positions = np.asarray(positions, np.int64)
    need = max(0, context - int(positions.min())) if positions.size else 0
    padded = np.concatenate([np.full(need, PAD, tokens.dtype), tokens]) if need else tokens
    at = positions[:, None] + need + np.arange(-context, 1)  # (B, T + 1)
    window = padded[at].astype(np.int64)
    return window[:, :-1], window[:, 1:]


class SequenceSampler(BatchSampler):
    """Random (inputs, targets) of shape (B, T) each from one token stream: the same seeded,
    saveable generator as BatchSampler, drawing the same positions for the same seed."""

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        positions = self.rng.integers(self.context, self.tokens.size, size=self.batch)
        return sequences(self.tokens, positions, self.context)

    __next__ = next


def held_out_sequences(tokens: np.ndarray, batch: int, count: int, context: int, *,
                       scored_context: int = CONTEXT, last_only: bool = True
                       ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The held-out targets of `fixed_batches(tokens, batch, count, scored_context)` (the
    MLP's), each with the `context` tokens before it: inputs (B, T) and targets (B,), the
    target after the window, scored at the last position exactly where the MLP is scored.
    `last_only=False`: targets (B, T), every position of the same windows (their mean loss)."""
    positions = fixed_positions(tokens, batch, count, scored_context)  # the MLP's targets
    out = []
    for k in range(count):
        inputs, targets = sequences(tokens, positions[k * batch:(k + 1) * batch], context)
        out.append((inputs, targets[:, -1] if last_only else targets))
    return out


def distinct_batch(tokens: np.ndarray, batch: int, context: int = CONTEXT, seed: int = 0
                   ) -> tuple[np.ndarray, np.ndarray]:
    """A batch whose contexts are all different. A corpus repeats contexts with different
    next bytes (runs of spaces in code), and no model can fit those to a loss of zero; the
    overfitting check needs a batch that can be learned by heart."""
    rng = np.random.default_rng(seed)
    positions = rng.integers(context, tokens.size, size=batch * 8)
    contexts, targets = windows(tokens, positions, context)
    _, first = np.unique(contexts, axis=0, return_index=True)
    keep = np.sort(first)[:batch]
    if keep.size < batch:
        raise SmallemError(f"the corpus has only {keep.size} distinct contexts among "
                           f"{positions.size} tried, fewer than a batch of {batch}")
    return contexts[keep], targets[keep]

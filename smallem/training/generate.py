"""Generation: a trained model continues a prompt one byte (or token) at a time, a Transformer
from a cache of its keys and values, and loading a model from a checkpoint to do so. Nothing
here trains; `smallem sample` and the notebooks call it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..autodiff.tape import Tape
from ..backends import DEFAULT_BACKEND, Backend, get_backend
from ..data import BOUNDARY, VOCAB, decode, encode
from ..errors import SmallemError, require
from ..models.protocol import LanguageModel
from ..models.transformer import KVCache
from ..tokens import Tokenizer
from .checkpoint import EDITED, Checkpoint, check_finite, load_checkpoint, load_parameters
from .config import build_model, largest_ask


def model_backend(model: LanguageModel) -> Backend:
    return model.parameters()[0].backend


class Window:
    """Which tokens the model reads for the next one: one policy for the cached and the uncached
    scores, so that the cache changes the speed of generation, never its text. The first read is
    the last `context` tokens; it grows by one each token until it is full, then restarts from its
    last half (a cache's positions are absolute: a window cannot slide under them). The model
    reads between T/2 and T tokens, never fewer."""

    def __init__(self, context: int) -> None:
        self.context, self.start = context, -1

    def __call__(self, n: int) -> tuple[int, bool]:
        """(the first of the n tokens read, whether the window starts again there)."""
        if self.start >= 0 and n - self.start <= self.context:
            return self.start, False
        self.start = max(0, n - (self.context if self.start < 0 else self.context // 2 + 1))
        return self.start, True


class UncachedScores:
    """Scores of the next token: the whole window read again for each one. A model that can
    keep a cache (a Transformer) reads the window `Window` gives the cache; one that reads a
    fixed number of bytes (the MLP) reads the last `context`."""

    def __init__(self, model: LanguageModel, backend: Backend, context: int) -> None:
        self.model, self.backend, self.context = model, backend, context
        self.window = Window(context) if hasattr(model, "cached_logits") else None

    def __call__(self, tokens: list[int]) -> np.ndarray:
        start = self.window(len(tokens))[0] if self.window else len(tokens) - self.context
        tape = Tape(self.backend)
        logits = self.model.logits(tape, np.array([tokens[start:]], dtype=np.int64))
        tape.close()
        z = np.asarray(self.backend.to_numpy(logits.value), dtype=np.float64)[0]
        return z[-1] if z.ndim == 2 else z  # a sequence model: its last position predicts


class CachedScores:
    """Scores of the next token from a KV cache: one new position per token, over the tokens
    `Window` says (a new cache where it starts again); `cache.tokens` is what it reads, and
    `model.logits` over them gives the same scores."""

    def __init__(self, model: LanguageModel, backend: Backend, context: int, attend: Any = None) -> None:
        self.model, self.backend, self.context, self.attend = model, backend, context, attend
        self.cache, self.seen, self.window = KVCache(model.config, backend, attend=attend), 0, Window(context)

    def __call__(self, tokens: list[int]) -> np.ndarray:
        start, fresh = self.window(len(tokens))
        new = tokens[start:] if fresh else tokens[self.seen:]
        if fresh and self.seen:
            self.cache = KVCache(self.model.config, self.backend, attend=self.attend)
        self.seen = len(tokens)
        tape = Tape(self.backend)
        logits = self.model.cached_logits(tape, np.array([new], dtype=np.int64), self.cache)
        tape.close()
        self.cache.tokens += new
        return np.asarray(self.backend.to_numpy(logits.value), dtype=np.float64)[0, -1]


def sample(model: LanguageModel, prompt: str | bytes = "", n_bytes: int = 200,
           temperature: float = 1.0, seed: int = 0, *, cache: bool = True,
           tokenizer: Tokenizer | None = None, attend: Any = None) -> str:
    """Continue `prompt` by `n_bytes` bytes drawn one token at a time (temperature 0: always the
    most likely). A Transformer keeps each block's keys and values (`cache=False`: it reads its
    whole window again for every token; `attend` replaces its one-position attention step, as
    lesson 16 does with the learner's). With `tokenizer`, the model reads and writes its ids;
    the continuation is decoded to bytes either way. Returns the continuation, as UTF-8."""
    require("the number of bytes to sample", n_bytes, "whole")
    require("the temperature", temperature, "non-negative")
    require("the seed", seed, "whole")
    if not isinstance(prompt, (str, bytes, bytearray)):
        raise SmallemError(f"sample: the prompt must be text or bytes, got {type(prompt).__name__} "
                           f"{prompt!r}: write it as text, e.g. sample(model, {str(prompt)!r})")
    check_tokenizer(model, tokenizer)
    backend = model_backend(model)
    context = model.config.context
    # The prompt starts a new document. In training, a document's first bytes were predicted
    # from the end of the previous one (ending in a newline) and the boundary token: pad with
    # that. A window of boundary tokens alone never occurs, and gives garbage.
    start = encode(prompt) if tokenizer is None else tokenizer.encode(encode(prompt))
    tokens = [10] * (context - 1) + [BOUNDARY] + start.tolist()
    scores = (CachedScores(model, backend, context, attend) if cache and hasattr(model, "cached_logits")
              else UncachedScores(model, backend, context))
    rng = np.random.default_rng(seed)
    out: list[int] = []
    written = 0  # bytes so far (a boundary counts as one, as in the byte stream)
    while written < n_bytes:
        z = scores(tokens)
        if not np.all(np.isfinite(z)):
            raise SmallemError("the model's scores are not finite numbers (NaN or infinite "
                               "weights: a run that diverged): train it again, with a smaller "
                               "learning rate or --clip")
        if temperature == 0:
            token = int(np.argmax(z))
        else:
            p = np.exp((z - z.max()) / temperature)
            token = int(rng.choice(p.size, p=p / p.sum()))
        tokens.append(token)
        out.append(token)
        written += 1 if tokenizer is None else max(1, len(tokenizer.pieces[token]))
    stream = out if tokenizer is None else tokenizer.decode(out)[:n_bytes]
    return decode(stream)


def check_tokenizer(model: LanguageModel, tokenizer: Tokenizer | None) -> None:
    """The ids `tokenizer` writes (None: the 257 of bytes) are those the model scores: sampled
    with another tokenizer, a model's ids would be looked up in the wrong table."""
    ids = VOCAB if tokenizer is None else tokenizer.vocab
    scored = getattr(model.config, "vocab", ids)
    if scored != ids:
        said = ("bytes (257 ids)" if tokenizer is None else f"a tokenizer of {ids:,} ids")
        raise SmallemError(f"sample: this model scores {scored:,} ids, but was given {said}: pass "
                           "the tokenizer it was trained with (training.tokenized.tokenizer_of"
                           "(checkpoint) reads it from its checkpoint)")


def load_model(path: str | Path, backend: Backend | str = DEFAULT_BACKEND
               ) -> tuple[LanguageModel, Checkpoint]:
    """The model stored in a checkpoint, on `backend`, ready to sample from."""
    checkpoint = load_checkpoint(path)
    config = checkpoint.train_config()
    try:
        model = build_model(config, get_backend(backend))
    except MemoryError as error:
        name, value, default = largest_ask(config) or ("batch", config.batch, config.batch)
        raise SmallemError(f"checkpoint {str(path)!r} asks for a model larger than this "
                           f"machine's memory ({str(error) or 'MemoryError'}): its {name} is "
                           f"{value:,}, {value / default:,.0f}× the {config.model}'s default "
                           f"{default:,}; {EDITED}") from None
    check_finite(checkpoint.parameters, str(path))  # a diverged run's weights: say which
    load_parameters(model, checkpoint.parameters, str(path))
    return model, checkpoint

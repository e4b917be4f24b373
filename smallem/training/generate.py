"""Generation: a trained model continues a prompt one byte (or token) at a time, a Transformer
from a cache of its keys and values, and loading a model from a checkpoint to do so. Nothing
here trains; `smallem sample` and the notebooks call it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..autodiff.tape import Tape
from ..backends import DEFAULT_BACKEND, Backend, get_backend
from ..data import BOUNDARY, decode, encode
from ..errors import SmallemError, require
from ..models.protocol import LanguageModel
from ..models.transformer import KVCache
from ..tokens import Tokenizer
from .checkpoint import EDITED, Checkpoint, check_finite, load_checkpoint, load_parameters
from .config import build_model, largest_ask


def model_backend(model: LanguageModel) -> Backend:
    return model.parameters()[0].backend


def _uncached(model: LanguageModel, backend: Backend, context: int) -> Callable[[list[int]], np.ndarray]:
    """Scores of the next token: the whole window read again for each one."""
    def scores(tokens: list[int]) -> np.ndarray:
        tape = Tape(backend)
        logits = model.logits(tape, np.array([tokens[-context:]], dtype=np.int64))
        tape.close()
        z = np.asarray(backend.to_numpy(logits.value), dtype=np.float64)[0]
        return z[-1] if z.ndim == 2 else z  # a sequence model: its last position predicts
    return scores


class CachedScores:
    """Scores of the next token from a KV cache: one new position per token. When the cache is
    full it restarts from the last half of the window (positions are absolute: a window cannot
    slide under them), so the model reads between T/2 and T tokens, never fewer; `cache.tokens`
    is what it reads, and `model.logits` over them gives the same scores."""

    def __init__(self, model: LanguageModel, backend: Backend, context: int, attend: Any = None) -> None:
        self.model, self.backend, self.context, self.attend = model, backend, context, attend
        self.cache, self.seen = KVCache(model.config, backend, attend=attend), 0

    def __call__(self, tokens: list[int]) -> np.ndarray:
        new = tokens[self.seen:] if self.seen else tokens[-self.context:]
        if self.cache.length + len(new) > self.context:
            self.cache = KVCache(self.model.config, self.backend, attend=self.attend)
            new = tokens[-min(self.context, max(len(new), self.context // 2 + 1)):]
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
    backend = model_backend(model)
    context = model.config.context
    # The prompt starts a new document. In training, a document's first bytes were predicted
    # from the end of the previous one (ending in a newline) and the boundary token: pad with
    # that. A window of boundary tokens alone never occurs, and gives garbage.
    start = encode(prompt) if tokenizer is None else tokenizer.encode(encode(prompt))
    tokens = [10] * (context - 1) + [BOUNDARY] + start.tolist()
    scores = (CachedScores(model, backend, context, attend) if cache and hasattr(model, "cached_logits")
              else _uncached(model, backend, context))
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

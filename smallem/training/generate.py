"""Generation: a trained model continues a prompt one byte at a time, and loading a model from
a checkpoint to do so. Nothing here trains; `smallem sample` and the notebooks call it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..autodiff.tape import Tape
from ..backends import DEFAULT_BACKEND, Backend, get_backend
from ..data import BOUNDARY, decode, encode
from ..errors import SmallemError, require
from ..models.protocol import LanguageModel
from .checkpoint import Checkpoint, check_finite, load_checkpoint, load_parameters
from .config import build_model, config_from


def model_backend(model: LanguageModel) -> Backend:
    return model.parameters()[0].backend


def sample(model: LanguageModel, prompt: str | bytes = "", n_bytes: int = 200,
           temperature: float = 1.0, seed: int = 0) -> str:
    """Continue `prompt` by `n_bytes` tokens drawn one at a time (temperature 0: always the
    most likely byte). Returns the continuation only, decoded as UTF-8."""
    require("the number of bytes to sample", n_bytes, "whole")
    require("the temperature", temperature, "non-negative")
    require("the seed", seed, "whole")
    backend = model_backend(model)
    context = model.config.context
    # The prompt starts a new document. In training, a document's first bytes were predicted
    # from the end of the previous one (ending in a newline) and the boundary token: pad with
    # that. A window of boundary tokens alone never occurs, and gives garbage.
    tokens = [10] * (context - 1) + [BOUNDARY] + encode(prompt).tolist()
    rng = np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(n_bytes):
        tape = Tape(backend)
        logits = model.logits(tape, np.array([tokens[-context:]], dtype=np.int64))
        tape.close()
        z = np.asarray(backend.to_numpy(logits.value), dtype=np.float64)[0]
        z = z[-1] if z.ndim == 2 else z  # a sequence model: its last position predicts
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
    return decode(out)


def load_model(path: str | Path, backend: Backend | str = DEFAULT_BACKEND
               ) -> tuple[LanguageModel, Checkpoint]:
    """The model stored in a checkpoint, on `backend`, ready to sample from."""
    checkpoint = load_checkpoint(path)
    model = build_model(config_from(checkpoint.config), get_backend(backend))
    check_finite(checkpoint.parameters, str(path))  # a diverged run's weights: say which
    load_parameters(model, checkpoint.parameters, str(path))
    return model, checkpoint

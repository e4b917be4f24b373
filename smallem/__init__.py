"""smallem: backpropagation built for real, on NumPy (CPU) and CuPy (GPU).

Its rooms, bottom to top: backends (where arrays live) → autodiff (the tape and its rules) →
nn, optim, data, models (the library the lessons name) → training (a run) → lessons (what the
notebooks look through) and exercises (their graders); tools (cli, figures, bench) sit outside.
This face exports what a lesson reads; lesson views are one dot away, in smallem.lessons.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Where each name of the face lives. They are imported on first use (PEP 562), so that
# `smallem` on the command line is ready to catch a Ctrl-C before NumPy has even loaded.
_FACE = {  # a room ("") is its module; `smallem.training.X` works after `import smallem`, as before
    **{name: "" for name in ("data", "models", "nn", "optim", "autodiff", "backends", "errors",
                             "training", "lessons", "exercises", "tools")},
    **{name: ".autodiff" for name in ("BackwardStep", "CrossEntropy", "Gradients", "Huber",
                                      "LayerNorm", "Operation", "Softmax", "Tape", "Var",
                                      "cross_entropy", "huber", "layer_norm", "softmax",
                                      "unbroadcast")},
    **{name: ".backends" for name in ("DEFAULT_BACKEND", "Backend", "get_backend",
                                      "gpu_available")},
    "SmallemError": ".errors",
    **{name: ".training" for name in ("TrainConfig", "evaluate", "load_model", "sample",
                                      "train")},
}

if TYPE_CHECKING:
    from . import data, models, nn, optim
    from .autodiff import (
        BackwardStep,
        CrossEntropy,
        Gradients,
        Huber,
        LayerNorm,
        Operation,
        Softmax,
        Tape,
        Var,
        cross_entropy,
        huber,
        layer_norm,
        softmax,
        unbroadcast,
    )
    from .backends import DEFAULT_BACKEND, Backend, get_backend, gpu_available
    from .errors import SmallemError
    from .training import TrainConfig, evaluate, load_model, sample, train


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module 'smallem' has no attribute {name!r}")
    where = _FACE[name]
    value = (importlib.import_module(f".{name}", __name__) if where == ""
             else getattr(importlib.import_module(where, __name__), name))
    globals()[name] = value  # once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_FACE})


__all__ = [
    "nn", "optim", "data", "models", "Backend", "DEFAULT_BACKEND", "get_backend", "gpu_available",
    "SmallemError", "Tape", "Var", "Gradients", "BackwardStep", "unbroadcast", "Operation",
    "CrossEntropy", "LayerNorm", "Huber", "Softmax", "cross_entropy", "layer_norm", "huber",
    "softmax", "TrainConfig",
    "train", "evaluate", "sample", "load_model",
]
__version__ = "0.4.0.dev0"

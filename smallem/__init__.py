"""smallem: backpropagation built for real, on NumPy (CPU) and CuPy (GPU).

Its rooms, bottom to top: backends (where arrays live) → autodiff (the tape and its rules) →
nn, optim, data, models (the library the lessons name) → training (a run) → lessons (what the
notebooks look through) and exercises (their graders); tools (cli, figures, bench) sit outside.
This face exports what a lesson reads; lesson views are one dot away, in smallem.lessons.
"""

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

__all__ = [
    "nn", "optim", "data", "models", "Backend", "DEFAULT_BACKEND", "get_backend", "gpu_available",
    "SmallemError", "Tape", "Var", "Gradients", "BackwardStep", "unbroadcast", "Operation",
    "CrossEntropy", "LayerNorm", "Huber", "Softmax", "cross_entropy", "layer_norm", "huber",
    "softmax", "TrainConfig",
    "train", "evaluate", "sample", "load_model",
]
__version__ = "0.4.0.dev0"

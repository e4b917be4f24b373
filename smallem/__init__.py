"""smallem: backpropagation built for real, on NumPy (CPU) and CuPy (GPU).

The layers, top to bottom: notebooks → train → nn/optim → tape (+ operations) → backends.
`from smallem import Tape, nn, optim` and `from smallem.models import Mlp` are the usual doors.
"""

from . import nn, optim
from .backends import DEFAULT_BACKEND, Backend, get_backend, gpu_available
from .errors import SmallemError
from .operations import CrossEntropy, Huber, LayerNorm, Operation, cross_entropy, huber, layer_norm
from .tape import BackwardStep, Gradients, Tape, Var, unbroadcast

__all__ = [
    "nn", "optim", "Backend", "DEFAULT_BACKEND", "get_backend", "gpu_available", "SmallemError",
    "Tape", "Var", "Gradients", "BackwardStep", "unbroadcast", "Operation", "CrossEntropy",
    "LayerNorm", "Huber", "cross_entropy", "layer_norm", "huber",
]
__version__ = "0.2.0"

"""smallem: backpropagation built for real, on NumPy (CPU) and CuPy (GPU).

The layers, top to bottom: notebooks → train → nn/optim → tape (+ operations) → backends.
"""

from .backends import Backend, get_backend, gpu_available
from .errors import SmallemError
from .operations import CrossEntropy, Huber, LayerNorm, cross_entropy, huber, layer_norm
from .tape import Gradients, Tape, Var, unbroadcast

__all__ = [
    "Backend", "get_backend", "gpu_available", "SmallemError", "Tape", "Var", "Gradients",
    "unbroadcast", "CrossEntropy", "LayerNorm", "Huber", "cross_entropy", "layer_norm", "huber",
]
__version__ = "0.1.0"

"""The engine: the tape (one rule lookup), the primitives with each rule under its forward,
operations that carry their own rule, and gradcheck, which tests every rule against finite
differences. It knows arrays only through a backend (smallem.backends)."""

from .attention import Attention, attention
from .checkpoint import Checkpoint, checkpoint
from .gradcheck import CASES, check_gradients, compare_backends, format_table, run_all, tape_gradients
from .operations import (
                         OPERATIONS,
                         CrossEntropy,
                         Huber,
                         LayerNorm,
                         Operation,
                         Softmax,
                         cross_entropy,
                         huber,
                         layer_norm,
                         register,
                         softmax,
)
from .primitives import PRIMITIVES, RULES, formula
from .tape import BackwardStep, Gradients, Tape, Var, unbroadcast

__all__ = [
    "Tape", "Var", "Gradients", "BackwardStep", "unbroadcast", "RULES", "formula", "PRIMITIVES",
    "OPERATIONS", "Operation", "register", "CrossEntropy", "LayerNorm", "Huber", "cross_entropy",
    "layer_norm", "huber", "Softmax", "softmax", "CASES", "check_gradients", "compare_backends",
    "format_table", "run_all",
    "tape_gradients", "Attention", "attention", "Checkpoint", "checkpoint",
]

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
from .qkv_attention import QkvAttention, qkv_attention
from .tape import BackwardStep, Gradients, Tape, Var, unbroadcast

__all__ = [
    "Tape", "Var", "Gradients", "BackwardStep", "unbroadcast", "RULES", "formula", "PRIMITIVES",
    "OPERATIONS", "Operation", "register", "CrossEntropy", "LayerNorm", "Huber", "cross_entropy",
    "layer_norm", "huber", "Softmax", "softmax", "CASES", "check_gradients", "compare_backends",
    "format_table", "run_all",
    "tape_gradients", "Attention", "attention", "QkvAttention", "qkv_attention", "Checkpoint", "checkpoint",
]


def __getattr__(name: str) -> object:
    # 0.3's FORMULAS (name -> maths), a second dict kept beside RULES: now read from RULES by
    # formula(name); the old name gives the same table, with a warning, until 0.5
    if name == "FORMULAS":
        import warnings

        warnings.warn("smallem.autodiff.FORMULAS is now formula(name), read from RULES (the name goes "
                      "away in 0.5)", DeprecationWarning, stacklevel=2)
        return {rule: formula(rule) for rule in RULES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

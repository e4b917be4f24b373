"""smallem: backpropagation built for real, on NumPy (CPU) and CuPy (GPU).

Its rooms, bottom to top: backends (where arrays live) → autodiff (the tape and its rules) →
nn, optim, data, models (the library the lessons name) → training (a run) → lessons (what the
notebooks look through) and exercises (their graders); tools (cli, figures, bench) sit outside.
This face exports what a lesson reads; lesson views are one dot away, in smallem.lessons.
The module paths of 0.2 (smallem.tape, smallem.train, ...) still import, with a warning, until 0.5.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
import warnings
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
__version__ = "0.4.0"

# -- the old module paths, for one version ---------------------------------------------------
# 0.2 had every module at the top (smallem/tape.py, ...); 0.3 put them into rooms; 0.4 moved the
# health monitor into training and the file helpers into files.py. Each old path imports the
# module at its new home, warns once (DeprecationWarning), and goes away in 0.5.
MOVED = {
    "smallem.tape": "smallem.autodiff.tape", "smallem.primitives": "smallem.autodiff.primitives",
    "smallem.operations": "smallem.autodiff.operations", "smallem.gradcheck": "smallem.autodiff.gradcheck",
    "smallem.step": "smallem.training.step", "smallem.train": "smallem.training.loop",
    "smallem.sample": "smallem.training.generate", "smallem.config": "smallem.training.config",
    "smallem.checks": "smallem.training.checks", "smallem.checkpoint": "smallem.training.checkpoint",
    "smallem.health": "smallem.training.health", "smallem.paths": "smallem.files",
    "smallem.byhand": "smallem.lessons.byhand", "smallem.dashboard": "smallem.lessons.dashboard",
    "smallem.plots": "smallem.lessons.plots", "smallem.stepthrough": "smallem.lessons.stepthrough",
    "smallem.tapegraph": "smallem.lessons.stepthrough", "smallem.widgets": "smallem.lessons.widgets",
    "smallem.bench": "smallem.tools.bench", "smallem.bench_reference": "smallem.tools.bench_reference",
    "smallem.cli": "smallem.tools.cli", "smallem.figures": "smallem.tools.figures",
    "smallem.lessons.health": "smallem.training.health", "smallem.training.paths": "smallem.files",
}


class _Moved:
    """Finds an old path (after every real module: it never hides one) and loads the new module.
    A finder and loader by its methods, not by importlib.abc's classes: importing those costs
    the command line a tenth of a second before it can catch a Ctrl-C (importlib.resources)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name in MOVED else None

    def create_module(self, spec):
        if spec.name not in _warned:
            _warned.add(spec.name)
            warnings.warn(f"{spec.name} is now {MOVED[spec.name]}: import it from there (the old path "
                          "goes away in 0.5)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(MOVED[spec.name])
        self.spec = module.__spec__  # the import system sets the old path's spec on it next
        return module

    def exec_module(self, module):
        module.__spec__ = self.spec  # nothing to run (it is loaded); its own spec back


class _Face(types.ModuleType):
    def __setattr__(self, name, value):
        # `import smallem.train` (0.2's module) must not replace the face's train() by a module
        # (a face name not read yet counts: it is a function once read, _FACE says)
        if not (isinstance(value, types.ModuleType) and f"{__name__}.{name}" in MOVED
                and (callable(self.__dict__.get(name)) or _FACE.get(name, "") != "")):
            super().__setattr__(name, value)


_warned: set[str] = set()
sys.modules[__name__].__class__ = _Face
if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.append(_Moved())

"""smallem: backpropagation built for real, on NumPy (CPU) and CuPy (GPU).

Its rooms, bottom to top: backends (where arrays live) → autodiff (the tape and its rules) →
nn, optim, data, models (the library the lessons name) → training (a run); tools (cli, figures,
bench) and the course (one folder per lesson: its graders, views, runs and recorded data) sit
outside, and nothing in the library imports them. This face exports what a lesson reads; a
lesson's own parts are in smallem.course.l01_chain_rule, ..., the shared ones in smallem.course.
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
                             "training", "course", "tools", "lessons", "exercises")},
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
__version__ = "0.5.0.dev0"

# -- the old module paths, for one version ---------------------------------------------------
# 0.2 had every module at the top (smallem/tape.py, ...); 0.3 put them into rooms; 0.4 moved the
# health monitor into training, the file helpers into files.py and the course into one folder per
# lesson. Each old path imports the module at its new home, warns once (DeprecationWarning), and
# goes away in 0.5.
MOVED = {
    "smallem.tape": "smallem.autodiff.tape", "smallem.primitives": "smallem.autodiff.primitives",
    "smallem.operations": "smallem.autodiff.operations", "smallem.gradcheck": "smallem.autodiff.gradcheck",
    "smallem.step": "smallem.training.step", "smallem.train": "smallem.training.loop",
    "smallem.sample": "smallem.training.generate", "smallem.config": "smallem.training.config",
    "smallem.checks": "smallem.training.checks", "smallem.checkpoint": "smallem.training.checkpoint",
    "smallem.health": "smallem.training.health", "smallem.paths": "smallem.files",
    "smallem.byhand": "smallem.course.l09_backprop_by_hand.byhand",
    "smallem.dashboard": "smallem.course.common.dashboard", "smallem.plots": "smallem.course.common.plots",
    "smallem.stepthrough": "smallem.course.common.stepthrough",
    "smallem.tapegraph": "smallem.course.common.stepthrough",
    "smallem.widgets": "smallem.course.common.widgets",
    "smallem.bench": "smallem.tools.bench", "smallem.bench_reference": "smallem.tools.bench_reference",
    "smallem.cli": "smallem.tools.cli", "smallem.figures": "smallem.tools.figures",
    # 0.4: the course is one folder per lesson (smallem.course.lNN_name) and common/ (issue 34); a
    # package before its modules (importing a module imports its package first)
    "smallem.lessons": "smallem.course", "smallem.exercises": "smallem.course",
    "smallem.lessons.health": "smallem.training.health", "smallem.training.paths": "smallem.files",
    **{f"smallem.lessons.{name}": f"smallem.course.common.{name}"
       for name in ("attention", "dashboard", "plots", "recordings", "stepthrough", "widgets")},
    "smallem.lessons.byhand": "smallem.course.l09_backprop_by_hand.byhand",
    "smallem.lessons.heads": "smallem.course.l12_transformer.heads",
    "smallem.lessons.precision": "smallem.course.l14_precision.precision",
    "smallem.training.short_runs": "smallem.course.l14_precision.short_runs",
    "smallem.exercises.grading": "smallem.course",  # split: grading.py and graders.py, both on the face
    "smallem.exercises.pieces": "smallem.course.l13_your_engine",  # split: pieces.py and diagnosis.py
    **{f"smallem.exercises.{name}": f"smallem.course.common.{name}" for name in ("predict", "progress")},
    **{f"smallem.exercises.{name}": f"smallem.course.l13_your_engine.{name}"
       for name in ("capstone", "your_transformer")},
    **{f"smallem.exercises.lesson{folder[1:3]}": f"smallem.course.{folder}.exercises" for folder in (
        "l01_chain_rule", "l02_the_tape", "l03_unbroadcast", "l04_finite_differences", "l05_mlp", "l06_adamw",
        "l07_learning_rate_cliff", "l08_leaky_abstractions", "l09_backprop_by_hand", "l11_attention",
        "l12_transformer", "l14_precision", "l15_memory", "l16_tokens")},
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
    # right after the path finder (which finds every real submodule through smallem.__path__), before
    # an editable install's finder, which would hand back a stale copy of a moved module's old file
    finders = [f.__name__ if isinstance(f, type) else type(f).__name__ for f in sys.meta_path]
    where = finders.index("PathFinder") + 1 if "PathFinder" in finders else len(finders)
    sys.meta_path.insert(where, _Moved())

"""The course: one folder per lesson (l01_chain_rule/, ..., l16_tokens/), each holding that
lesson's exercises (graders and solutions), its views, its runs and its recorded data, beside
common/ (the grading framework, the progress store, reveal, the widgets and plots several lessons
use, `recorded()`). Nothing in the library imports it; a notebook imports one lesson's folder
(`from smallem.course.l14_precision import check, RuleScaler`) or this face.

Every name here is imported on first use (PEP 562): importing the course, a lesson or the graders
loads no widget library. A lesson is found by its folder alone (`load_lessons`): a new lesson is
its folder, its notebook and README's row, named nowhere else.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
import types
from typing import Any

from .common import LESSON

# Where each name of the face lives, below this package. The grading names register every
# lesson's exercises first (load_lessons), as `check("14.rule_scaler", ...)` needs lesson 14's.
_GRADING = ("EXERCISES", "EXPECT_SOLVED", "Exercise", "ExerciseNotSolved", "Verdict", "check",
            "exercise", "grade", "hint", "reveal", "show_solution", "solution", "use")
_FACE = {
    **{name: ".common.grading" for name in _GRADING},
    **{name: ".common.graders" for name in ("Wrong", "NotDone", "call", "cases", "compare", "describe",
                                             "differing", "grade_rule", "number", "off_by", "parts")},
    **{name: ".common.progress" for name in ("answers", "data_folder", "load", "record", "reset")},
    **{name: ".common.recordings" for name in ("recorded", "trained")},
    **{name: ".common.attention" for name in ("AttentionView", "OneHeadLM", "attention_weights", "losses_at",
                                               "opener_distances", "recorded_curve", "recorded_run",
                                               "render_html", "samples_html", "strongest")},
    "LiveDashboard": ".common.dashboard",
    **{name: ".common.stepthrough" for name in ("BackwardWalk", "StepThrough")},
    **{name: ".common.widgets" for name in ("LearningRateCliff", "LiveFigure")},
    "progress_bar": "smallem.training.bar",  # notebooks' own loops show the bar train() shows
    **{name: "smallem.training.health" for name in ("HealthMonitor", "dead_fraction", "dead_units")},
}
_MODULES = {name: f".common.{name}" for name in ("attention", "dashboard", "plots", "stepthrough",
                                                  "widgets", "grading", "graders", "predict", "recordings",
                                                  "references")}
# The names smallem.lessons and smallem.exercises gave in 0.4 that now live in one lesson's folder
# (a notebook imports them from there); kept for the old paths' one release.
_FORMER = {
    **{name: ".l12_transformer.heads" for name in ("closing_windows", "plot_head_maps", "weight_on",
                                                   "weights_of")},
}
_MODULES |= {"heads": ".l12_transformer.heads", "byhand": ".l09_backprop_by_hand.byhand",
             "capstone": ".l13_your_engine.capstone", "your_transformer": ".l13_your_engine.your_transformer",
             "pieces": ".l13_your_engine"}  # the capstone's face: its pieces.py and diagnosis.py


def lesson_folders() -> list[str]:
    """The lessons' folders in this package ("l01_chain_rule", ...), in order."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg and LESSON.fullmatch(m.name))


def load_lessons() -> list[str]:
    """Import every lesson's exercises (lNN_name/exercises.py); importing one registers its
    exercises. Returns the modules' names. A lesson without exercises (10) has no such module."""
    names = []
    for folder in lesson_folders():
        name = f"{__name__}.{folder}.exercises"
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
            names.append(name)
    return names


class _ProgressModule(types.ModuleType):
    """common/progress.py (the store) that is also `progress()` (the table a learner asks for): both
    `from smallem.course import progress; progress()` and `import smallem.course.common.progress
    as store` work, where a function of the same name would hide the module."""

    def __call__(self) -> Any:
        load_lessons()
        return importlib.import_module(".common.grading", __name__).progress()


class _Course(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        # `import smallem.exercises.progress` (0.4's path: its parent is this module) sets the store
        # here as `progress`: it stays the callable one
        if name == "progress" and isinstance(value, types.ModuleType):
            value.__class__ = _ProgressModule
        super().__setattr__(name, value)


def __getattr__(name: str) -> Any:
    if name == "progress":
        value = importlib.import_module(".common.progress", __name__)
        value.__class__ = _ProgressModule
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name], __name__)
    elif name in _FACE or name in _FORMER:
        if name in _GRADING:
            load_lessons()
        value = getattr(importlib.import_module(_FACE.get(name) or _FORMER[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_FACE, *_MODULES, "progress"})


# what `from smallem.course import *` gives: the learner's verbs (no view: they load the widgets)
__all__ = ["check", "hint", "progress", "reveal", "show_solution", "use", "solution", "grade",
           "answers", "recorded", "trained", "load_lessons", "lesson_folders"]
sys.modules[__name__].__class__ = _Course

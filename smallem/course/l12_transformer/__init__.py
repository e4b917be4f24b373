"""Lesson 12, the Transformer (notebooks/12_transformer.ipynb): its exercises (exercises.py), what the
trained model's heads look at (heads.py) and the shipped models and GPU runs (recorded/).
Its face names them on first use (common.lesson_face), with the learner's `check`, `hint`, ...; it
imports no other lesson."""

from ..common import lesson_face

__getattr__, __dir__ = lesson_face(__name__, "heads", "exercises")

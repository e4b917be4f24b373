"""Lesson 14, precision (notebooks/14_precision.ipynb): its exercises (exercises.py), the views
(precision.py), the short runs the notebook trains (short_runs.py), and the H200's record
(recorded/, written by `python3 -m smallem.course.l14_precision.record` on a GPU).
Its face names them on first use (common.lesson_face), with the learner's `check`, `hint`, ...; it
imports no other lesson."""

from ..common import lesson_face

__getattr__, __dir__ = lesson_face(__name__, "precision", "short_runs", "exercises")

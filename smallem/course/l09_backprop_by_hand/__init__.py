"""Lesson 09, backprop by hand (notebooks/09_backprop_by_hand.ipynb): its exercises (exercises.py) and
the hand-written backward's comparisons (byhand.py).
Its face names them on first use (common.lesson_face), with the learner's `check`, `hint`, ...; it
imports no other lesson."""

from ..common import lesson_face

__getattr__, __dir__ = lesson_face(__name__, "byhand", "exercises")

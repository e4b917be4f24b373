"""Lesson 03, unbroadcast (notebooks/03_unbroadcast.ipynb): its exercises (exercises.py).
Its face names them on first use (common.lesson_face), with the learner's `check`, `hint`, ...; it
imports no other lesson."""

from ..common import lesson_face

__getattr__, __dir__ = lesson_face(__name__, "exercises")

"""Lesson 16, tokens (notebooks/16_tokens.ipynb): its exercises (exercises.py) and the GPU run it shows
(recorded/).
Its face names them on first use (common.lesson_face), with the learner's `check`, `hint`, ...; it
imports no other lesson."""

from ..common import lesson_face

__getattr__, __dir__ = lesson_face(__name__, "exercises")

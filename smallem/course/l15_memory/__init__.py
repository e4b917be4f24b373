"""Lesson 15, memory (notebooks/15_memory.ipynb): its exercises (exercises.py) and the H200's record
(recorded/, written by `python3 -m smallem.course.l15_memory.record` on a GPU).
Its face names them on first use (common.lesson_face), with the learner's `check`, `hint`, ...; it
imports no other lesson."""

from ..common import lesson_face

__getattr__, __dir__ = lesson_face(__name__, "exercises")

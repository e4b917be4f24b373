"""Lesson 10, the captured step (notebooks/10_the_captured_step.ipynb): no exercises: its results
recorded on the H200 (recorded/), read through `recorded(name)`.
Its face names them on first use (common.lesson_face), with the learner's `check`, `hint`, ...; it
imports no other lesson."""

from ..common import lesson_face

__getattr__, __dir__ = lesson_face(__name__)

"""Lesson 13, your engine (the capstone) (notebooks/13_your_engine.ipynb): the learner's answers of
lessons 02-12 rebuilt (pieces.py), each checked alone (diagnosis.py), and raced against the
package's MLP (capstone.py) and Transformer (your_transformer.py).
Its face names them on first use (common.lesson_face), with the learner's `check`, `hint`, ...; it
imports no other lesson."""

from ..common import lesson_face

__getattr__, __dir__ = lesson_face(__name__, "capstone", "your_transformer", "pieces", "diagnosis")

"""Lesson 09's own grader behaviour beyond the shared tests (tests/test_exercises.py): the
scatter-add trap is named, with the fix."""

from __future__ import annotations

from smallem.course import EXERCISES, grade


def test_the_trap_is_named():
    buffered, _ = EXERCISES["09.embedding_backward"].mistakes["replace instead of accumulate"]
    message = grade("09.embedding_backward", buffered).message
    assert "one of its four contributions" in message and "np.add.at" in message

"""Lesson 14 beyond the generic exercise tests (tests/test_exercises.py feeds every planted
mistake): the learner's loss-scaler rule drives a LossScaler, as the lesson's fp16 run uses it."""

from smallem.course import solution
from smallem.course.l14_precision.exercises import RuleScaler


def test_the_learners_rule_drives_a_scaler():
    scaler = RuleScaler(solution("14.loss_scaler"), scale=64.0, interval=2)
    assert [scaler.update(f) for f in (False, True, True)] == [False, True, True]
    assert scaler.scale == 64.0 and scaler.skipped == 1

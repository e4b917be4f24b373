"""Lesson 14's graders: the solutions pass, and each planted mistake is named."""

import numpy as np
import pytest

from smallem.exercises import grade, solution
from smallem.exercises.lesson14 import RuleScaler, bf16_reference

IDS = ("14.to_bf16", "14.loss_scaler", "14.master_update")


@pytest.mark.parametrize("exercise_id", IDS)
def test_the_solution_passes(exercise_id):
    assert grade(exercise_id, solution(exercise_id)).ok


def test_truncation_and_ties_away_are_named():
    cut = lambda x: (x.view(np.uint32) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    up = lambda x: ((x.view(np.uint32) + 0x8000) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    assert "rounds towards zero" in grade("14.to_bf16", cut).message
    assert "ties to even" in grade("14.to_bf16", up).message
    assert "ml_dtypes" in grade("14.to_bf16", lambda x: x).message


def test_scaler_mistakes_are_named():
    def no_halving(scale, clean, finite, interval):
        if not finite:
            return False, scale, 0
        return True, scale * 2 if clean + 1 == interval else scale, (clean + 1) % interval

    def applies_anyway(scale, clean, finite, interval):
        return True, scale / 2 if not finite else scale, 0

    def never_resets(scale, clean, finite, interval):
        if not finite:
            return False, scale / 2, clean
        clean += 1
        return (True, scale * 2, 0) if clean == interval else (True, scale, clean)

    assert "must halve" in grade("14.loss_scaler", no_halving).message
    assert "must be skipped" in grade("14.loss_scaler", applies_anyway).message
    assert "clean count" in grade("14.loss_scaler", never_resets).message


def test_the_learners_rule_drives_a_scaler():
    scaler = RuleScaler(solution("14.loss_scaler"), scale=64.0, interval=2)
    assert [scaler.update(f) for f in (False, True, True)] == [False, True, True]
    assert scaler.scale == 64.0 and scaler.skipped == 1


def test_a_master_kept_in_bf16_is_named():
    def rounded_master(master, grad, lr):
        new = bf16_reference(bf16_reference(master) - np.float32(lr) * grad)
        return new, new

    assert "must keep its float32" in grade("14.master_update", rounded_master).message

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


def _stubs():
    """Each exercise cell of notebook 14 as shipped, run: the stub a learner starts from."""
    import linecache
    import re
    from pathlib import Path

    import nbformat

    path = Path(__file__).resolve().parent.parent / "notebooks" / "14_precision.ipynb"
    out = {}
    for cell in nbformat.read(path, as_version=4).cells:
        if "exercise" in cell.metadata.get("tags", []):
            exercise_id = re.match(r"# Exercise (\d\d\.\w+)", cell.source).group(1)
            namespace, name = {"np": np}, f"<cell {exercise_id}>"
            # as IPython does: the cell's source readable by inspect, which the grader reads
            linecache.cache[name] = (len(cell.source), None, cell.source.splitlines(True), name)
            exec(compile(cell.source, name, "exec"), namespace)  # noqa: S102
            out[exercise_id] = next(v for k, v in namespace.items() if callable(v) and k != "np")
    return out


def test_the_notebooks_stubs_are_not_done_and_offer_the_hint_first():
    stubs = _stubs()
    assert sorted(stubs) == sorted(IDS)
    for exercise_id, stub in stubs.items():
        verdict = grade(exercise_id, stub)
        assert not verdict.done and f"hint('{exercise_id}')" in verdict.message


@pytest.mark.parametrize("exercise_id", IDS)
def test_a_function_that_returns_none_is_told_so(exercise_id):
    def forgot(*args):
        np.zeros(3)  # works, but returns nothing

    assert "returned None" in grade(exercise_id, forgot).message

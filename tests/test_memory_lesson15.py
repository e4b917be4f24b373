"""Lesson 15's graders: the solution passes, planted mistakes are caught in one sentence."""

from __future__ import annotations

import numpy as np
import pytest

from smallem.exercises import grade, solution


def _update(rescale_acc=True, keep_max=True, rescale_sum=True):
    def online_update(m, total, acc, s, v):
        m_new = np.maximum(m, s.max(-1, keepdims=True)) if keep_max else s.max(-1, keepdims=True)
        alpha, p = np.exp(m - m_new), np.exp(s - m_new)
        return (m_new, (total * alpha if rescale_sum else total) + p.sum(-1, keepdims=True),
                (acc * alpha if rescale_acc else acc) + p @ v)
    return online_update


def _tile(scale=True, delta=True, mask=True):
    def tile_backward(q, k, v, do, lse, d, c, m):
        s = q @ np.swapaxes(k, -1, -2) * c + (0.0 if m is None or not mask else m)
        p = np.exp(s - lse)
        ds = p * (do @ np.swapaxes(v, -1, -2) - (d if delta else 0.0))
        f = c if scale else 1.0
        return ds @ k * f, np.swapaxes(ds, -1, -2) @ q * f, np.swapaxes(p, -1, -2) @ do
    return tile_backward


PLANTED = {
    "15.attention_bytes": {
        "one (T, T) matrix": (lambda b, t, c, h, i=4: i * (10 * b * t * c + b * h * t * t),
                              "only one (B, H, T, T)"),
        "heads forgotten": (lambda b, t, c, h, i=4: i * (10 * b * t * c + 3 * b * t * t),
                            "once per head"),
        "numbers, not bytes": (lambda b, t, c, h, i=4: 10 * b * t * c + 3 * b * h * t * t,
                               "not bytes"),
        "views counted": (lambda b, t, c, h, i=4: i * (16 * b * t * c + 3 * b * h * t * t), "views"),
        "no (T, T)": (lambda b, t, c, h, i=4: i * 10 * b * t * c, "matrices are missing"),
        "something else": (lambda b, t, c, h, i=4: 7, "where the tape keeps"),
    },
    "15.online_update": {
        "acc not rescaled": (_update(rescale_acc=False), "acc is not rescaled"),
        "the old max forgotten": (_update(keep_max=False), "forgets the old one"),
        "the sum not rescaled": (_update(rescale_sum=False), "l_new"),
        "two values": (lambda m, total, acc, s, v: (m, total), "returns three arrays"),
    },
    "15.tile_backward": {
        "no scale": (_tile(scale=False), "finite differences disagree"),
        "no delta": (_tile(delta=False), "finite differences disagree"),
        "mask ignored": (_tile(mask=False), "is the mask added"),
        "dK without the transpose": (lambda q, k, v, do, lse, d, c, m: (q, q, v), "tile_backward"),
    },
}
IDS = list(PLANTED)


@pytest.mark.parametrize("exercise_id", IDS)
def test_solution_is_right(exercise_id):
    verdict = grade(exercise_id, solution(exercise_id))
    assert verdict.ok and verdict.done, verdict.message


@pytest.mark.parametrize("exercise_id, mistake", [(e, m) for e in IDS for m in PLANTED[e]])
def test_planted_mistake_is_caught(exercise_id, mistake):
    answer, words = PLANTED[exercise_id][mistake]
    with np.errstate(all="ignore"):
        verdict = grade(exercise_id, answer)
    assert not verdict.ok and verdict.done, verdict.message
    assert verdict.message.count("\n") == 0 and "Traceback" not in verdict.message
    assert words in verdict.message and "Hint:" in verdict.message, verdict.message


@pytest.mark.parametrize("exercise_id", IDS)
def test_stub_is_not_done(exercise_id):
    def stub(*args):
        ...
    verdict = grade(exercise_id, stub)
    assert not verdict.done and "show_solution" in verdict.message

"""Lesson 11's graders: the solution passes, planted mistakes are caught in one sentence."""

from __future__ import annotations

import math

import numpy as np
import pytest

from smallem.exercises import grade, solution
from smallem.exercises.lesson11 import softmax_rows


def _head(scale, causal=True, detach=False, swap=False):
    """A one-head answer built like the solution, with one planted change."""
    def one_head(tape, x, wq, wk, wv):
        softmax = solution("11.one_head").__globals__["softmax"]
        q, k, v = x @ wq, x @ wk, x @ wv
        scores = (k @ tape.transpose(q) if swap else q @ tape.transpose(k)) / scale(wq.shape[1])
        weights = softmax(tape, scores, causal=causal)
        if detach:
            weights = tape.constant(weights.value)  # computed, then cut off from the tape
        return weights @ v
    return one_head


def _split_straight(tape, x, heads):
    b, t, c = x.shape
    return tape.reshape(x, (b, heads, t, c // heads))


def _merge_straight(tape, y):
    b, h, t, d = y.shape
    return tape.reshape(y, (b, t, h * d))


def _split_right(tape, x, heads):
    b, t, c = x.shape
    return tape.transpose(tape.reshape(x, (b, t, heads, c // heads)), 1, 2)


def _merge_right(tape, y):
    b, h, t, d = y.shape
    return tape.reshape(tape.transpose(y, 1, 2), (b, t, h * d))


# id -> {mistake: (planted answer, words the verdict must contain)}
PLANTED = {
    "11.softmax_backward": {
        "the diagonal only": (lambda s, g: g * s * (1 - s), "only the diagonal of the Jacobian"),
        "no sum term": (lambda s, g: g * s, "leaves out the sum"),
        "sum over the wrong axis": (lambda s, g: s * (g - (g * s).sum(axis=0, keepdims=True)),
                                    "where finite differences give"),
        "sign of the sum": (lambda s, g: s * (g + (g * s).sum(axis=-1, keepdims=True)),
                            "where finite differences give"),
        "no keepdims": (lambda s, g: s * (g - (g * s).sum(axis=-1)), "raised ValueError"),
    },
    "11.causal_mask": {
        "leaky (k=1)": (lambda t: np.tril(np.ones((t, t), bool), k=1), "the leaky mask"),
        "upside down": (lambda t: np.triu(np.ones((t, t), bool)), "upside down"),
        "no diagonal": (lambda t: np.tril(np.ones((t, t), bool), k=-1), "row 0 allows nothing"),
        "nothing masked": (lambda t: np.ones((t, t), bool), "every entry is allowed"),
        "an additive mask": (lambda t: np.where(np.tril(np.ones((t, t))), 0.0, -np.inf), "True/False"),
        "a vector": (lambda t: np.ones(t, bool), "should be [4, 4]"),
    },
    "11.one_head": {
        "no 1/sqrt(D)": (_head(lambda d: 1.0), "not divided by √D = 2"),
        "1/D": (_head(lambda d: d), "divided by D = 4"),
        "no mask": (_head(math.sqrt, causal=False), "no causal mask"),
        "q and k swapped": (_head(math.sqrt, swap=True), "the scores are k qᵀ"),
        "weights detached": (_head(math.sqrt, detach=True), "computed outside the tape"),
        "a NumPy array": (lambda tape, x, wq, wk, wv: np.zeros((5, 4)), "a NumPy array has no gradient"),
    },
    "11.split_heads": {
        "straight reshape": ((_split_straight, _merge_right), "cuts the sequence, not the channels"),
        "merge without the transpose": ((_split_right, _merge_straight), "swap H and T back first"),
        "one function": (_split_right, "the two functions"),
        "heads last": ((lambda tape, x, h: tape.reshape(x, (x.shape[0], x.shape[1], h, -1)), _merge_right),
                       "where it should be [2, 3, 5, 4]"),
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
    answer = (stub, stub) if exercise_id == "11.split_heads" else stub
    verdict = grade(exercise_id, answer)
    assert not verdict.done and "show_solution" in verdict.message


def test_softmax_rows_gives_masked_entries_exactly_zero():
    s = softmax_rows(np.zeros((3, 3)), np.tril(np.ones((3, 3), bool)))
    assert np.array_equal(s, [[1, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]])

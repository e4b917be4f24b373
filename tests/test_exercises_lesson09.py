"""Lesson 09's graders: the solution passes, planted mistakes are caught in one sentence."""

from __future__ import annotations

import numpy as np
import pytest

from smallem.exercises import grade, solution


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _onehot(targets, v):
    return np.eye(v)[targets]


WRONG = {
    "09.dlogits": {
        "sign flipped": lambda z, y: (_onehot(y, z.shape[1]) - _softmax(z)) / len(y),
        "no 1/N": lambda z, y: _softmax(z) - _onehot(y, z.shape[1]),
        "no row max": lambda z, y: (np.exp(z) / np.exp(z).sum(1, keepdims=True)
                                    - _onehot(y, z.shape[1])) / len(y),
        "softmax over the batch": lambda z, y: (np.exp(z) / np.exp(z).sum(0, keepdims=True)
                                                - _onehot(y, z.shape[1])) / len(y),
    },
    "09.linear_backward": {
        "dW transposed": lambda x, w, dy: (dy @ w.T, dy.T @ x, dy.sum(0)),
        "db not summed": lambda x, w, dy: (dy @ w.T, x.T @ dy, dy),
        "db summed over the wrong axis": lambda x, w, dy: (dy @ w.T, x.T @ dy, dy.sum(1)),
        "dx without the transpose": lambda x, w, dy: (dy @ w, x.T @ dy, dy.sum(0)),
        "two values": lambda x, w, dy: (dy @ w.T, x.T @ dy),
    },
    "09.tanh_backward": {
        "forgot the square": lambda out, dout: dout * (1 - out),
        "treated out as the input": lambda out, dout: dout * (1 - np.tanh(out) ** 2),
        "no upstream gradient": lambda out, dout: 1 - out**2,
    },
    "09.embedding_backward": {
        "replace instead of accumulate": None,  # filled below
        "sum over the batch only": lambda tok, dv, v: np.zeros((v, dv.shape[-1])),
    },
    "09.layer_norm_dx": {
        "no projection term": lambda xh, s, g: s * (g - g.mean(-1, keepdims=True)),
        "no mean(g)": lambda xh, s, g: s * (g - xh * (g * xh).mean(-1, keepdims=True)),
        "no 1/sigma": lambda xh, s, g: g - g.mean(-1, keepdims=True) - xh * (g * xh).mean(-1, keepdims=True),
        "sign of the projection": lambda xh, s, g: s * (g - g.mean(-1, keepdims=True)
                                                        + xh * (g * xh).mean(-1, keepdims=True)),
    },
}


def _buffered(tokens, dvectors, vocab):
    dtable = np.zeros((vocab, dvectors.shape[-1]))
    dtable[tokens] += dvectors  # the trap: repeated tokens keep one contribution
    return dtable


WRONG["09.embedding_backward"]["replace instead of accumulate"] = _buffered

IDS = list(WRONG)


@pytest.mark.parametrize("exercise_id", IDS)
def test_solution_is_right(exercise_id):
    verdict = grade(exercise_id, solution(exercise_id))
    assert verdict.ok and verdict.done, verdict.message


@pytest.mark.parametrize("exercise_id, mistake",
                         [(e, m) for e in IDS for m in WRONG[e]])
def test_planted_mistake_is_caught(exercise_id, mistake):
    with np.errstate(all="ignore"):
        verdict = grade(exercise_id, WRONG[exercise_id][mistake])
    assert not verdict.ok and verdict.done
    assert verdict.message.count("\n") == 0 and "Traceback" not in verdict.message
    assert "Hint:" in verdict.message


@pytest.mark.parametrize("exercise_id", IDS)
def test_stub_is_not_done(exercise_id):
    def stub(*args):
        ...
    verdict = grade(exercise_id, stub)
    assert not verdict.done and "show_solution" in verdict.message


def test_the_trap_is_named():
    message = grade("09.embedding_backward", _buffered).message
    assert "one of its four contributions" in message and "np.add.at" in message

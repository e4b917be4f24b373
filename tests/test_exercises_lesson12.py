"""Lesson 12's graders: the solution passes, planted mistakes are caught in one sentence."""

from __future__ import annotations

import numpy as np
import pytest

from smallem.exercises import grade, solution


def _count(norms=True, positions=True, hidden=4):
    def count(layers, width, context, vocab=257):
        c = width
        mlp = (c * hidden * c + hidden * c) + (hidden * c * c + c)
        block = (4 * c if norms else 0) + 4 * (c * c + c) + mlp
        return vocab * c + (context * c if positions else 0) + layers * block + (2 * c if norms else 0) \
            + (c * vocab + vocab)
    return count


def _post_ln(tape, block, x):
    x = block.attention_norm(tape, x + block.attention(tape, x))
    return block.mlp_norm(tape, x + block.mlp(tape, x))


def _mlp_replaces(tape, block, x):
    x = x + block.attention(tape, block.attention_norm(tape, x))
    return block.mlp(tape, block.mlp_norm(tape, x))


def _one_norm(tape, block, x):
    x = x + block.attention(tape, block.attention_norm(tape, x))
    return x + block.mlp(tape, block.attention_norm(tape, x))


PLANTED = {
    "12.parameter_count": {
        "no LayerNorms": (_count(norms=False), "its LayerNorms alone hold"),
        "no position table": (_count(positions=False), "its position table alone holds"),
        "MLP C -> C": (_count(hidden=1), "where the model holds 134,273"),
    },
    "12.block": {
        "post-LN": (_post_ln, "post-LN block"),
        "MLP replaces x": (_mlp_replaces, "replaces x instead of being added"),
        "one LayerNorm for both": (_one_norm, "where the model's block gives"),
        "a NumPy array": (lambda tape, block, x: np.zeros((2, 5, 16)), "returns the tape's Var"),
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

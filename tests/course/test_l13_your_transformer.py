"""The capstone's second part (exercises/your_transformer.py): a Transformer built from the
learner's pieces of lessons 11-12 on their engine trains as the package's does, to float64
rounding, with the solutions and with the alternate answers; a wrong piece in each of the four
11-12 pieces is found alone on the model's shapes and named in the verdict."""

from __future__ import annotations

import pytest

from smallem.course import EXERCISES
from smallem.course.l13_your_engine.pieces import your_pieces
from smallem.course.l13_your_engine.your_transformer import (
    CONFIG,
    ROLES_11_12,
    TRANSFORMER_ROLES,
    diagnose,
    race,
)
from smallem.data import SequenceSampler, load_corpus
from smallem.models import Transformer

SOLUTIONS = {e: EXERCISES[e].solution_cell for e in TRANSFORMER_ROLES}
ALTERNATES = {e: EXERCISES[e].alternate_cell or EXERCISES[e].solution_cell for e in TRANSFORMER_ROLES}
WRONG = {  # one planted wrong piece for each of the 11-12 pieces, as a learner might write it
    "11.softmax_backward": "def softmax_backward(s, g):\n    return g * s * (1 - s)\n",
    "11.causal_mask": "def causal_mask(T):\n    return np.tril(np.ones((T, T), dtype=bool), k=1)\n",
    "11.split_heads": ("def split_heads(tape, x, heads):\n    B, T, C = x.shape\n"
                       "    return tape.reshape(x, (B, heads, T, C // heads))\n\n"
                       "def merge_heads(tape, y):\n    B, H, T, D = y.shape\n"
                       "    return tape.reshape(tape.transpose(y, 1, 2), (B, T, H * D))\n"),
    "12.block": ("def block_forward(tape, block, x):\n"
                 "    x = block.attention_norm(tape, x + block.attention(tape, x))\n"
                 "    return block.mlp_norm(tape, x + block.mlp(tape, x))\n"),
}


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


@pytest.mark.parametrize("sources", [SOLUTIONS, ALTERNATES], ids=["solutions", "alternates"])
def test_the_learners_transformer_trains_as_the_packages(corpus, sources):
    result = race(sources, steps=4, eval_every=2, corpus=corpus, progress_bar=False, log=None)
    assert result.count == len(TRANSFORMER_ROLES) and not result.stopped
    assert result.agrees and result.largest_difference < 1e-12
    assert result.yours[-1] < result.yours[0]  # it trained
    assert "✓ Your engine trained a Transformer: every piece is yours" in result.verdict()


def test_blank_pieces_are_the_packages_and_named(corpus):
    result = race({}, steps=2, corpus=corpus, progress_bar=False, log=None)
    assert result.count == 0 and result.agrees
    assert all(f"{eid} (left blank)" in result.pieces_line() for eid in TRANSFORMER_ROLES)


@pytest.mark.parametrize("exercise_id", sorted(ROLES_11_12))
def test_a_wrong_piece_is_found_alone_on_the_models_shapes(corpus, exercise_id):
    model = Transformer(CONFIG, backend="cpu64", seed=0)
    inputs, _ = SequenceSampler(corpus.train, batch=8, context=CONFIG.context, seed=0).next()
    found = diagnose(your_pieces({**SOLUTIONS, exercise_id: WRONG[exercise_id]}, roles=TRANSFORMER_ROLES),
                     model, inputs)
    wrong = [f for f in found if not f.ok]
    assert [f.piece.id for f in wrong] == [exercise_id] and f"your {exercise_id}" in wrong[0].sentence
    assert all(f.ok for f in diagnose(your_pieces(ALTERNATES, roles=TRANSFORMER_ROLES), model, inputs))


def test_a_wrong_softmax_rule_makes_the_race_diverge_and_is_named(corpus):
    result = race(SOLUTIONS, steps=3, corpus=corpus, progress_bar=False, log=None,
                  plant={"11.softmax_backward": WRONG["11.softmax_backward"]})
    assert not result.agrees and "your 11.softmax_backward is wrong" in result.verdict().lower()

"""Lesson 16's graders: the solutions pass, planted mistakes are caught in one sentence, and the
learner's rule and encode drive the package's trainer and tokenizer to the same results."""

from __future__ import annotations

import math

import numpy as np
import pytest

from smallem import tokens as T
from smallem.exercises import grade, solution
from smallem.exercises.lesson16 import SMALL_TEXT


def _count_once(words):
    pairs = {}
    for word in words:
        for pair in zip(word, word[1:]):
            pairs[pair] = pairs.get(pair, 0) + 1
    return pairs


def _merge_right_to_left(word, pair, new):
    return tuple(reversed(T.merge(tuple(reversed(word)), pair[::-1], new)))


def _encode_by_frequency_order(chunk, rank):
    ids = list(chunk)
    for pair in sorted(rank, key=rank.get, reverse=True):  # the last merge first
        ids = list(T.merge(ids, pair, 257 + rank[pair]))
    return ids


def _step(scale=True, own_only=False):
    def cached_step(q, keys, values):
        if own_only:
            return values[..., -1:, :]
        scores = q @ keys.swapaxes(-1, -2) / (math.sqrt(q.shape[-1]) if scale else 1.0)
        w = np.exp(scores - scores.max(-1, keepdims=True))
        return (w / w.sum(-1, keepdims=True)) @ values
    return cached_step


PLANTED = {
    "16.merge_rule": {
        "pairs counted once per word": ((_count_once, T.merge), "counted once per word"),
        "merged from the right": ((T.count_pairs, _merge_right_to_left), "cut at the left"),
    },
    "16.encode": {
        "the last merge first": (_encode_by_frequency_order, "in the order they were learnt"),
        "bytes only": (lambda chunk, rank: list(chunk), "should be [257, 99]"),
    },
    "16.cached_step": {
        "no 1/√D": (_step(scale=False), "not divided by √D"),
        "its own value only": (_step(own_only=True), "new position's own value"),
    },
}


@pytest.mark.parametrize("exercise_id", sorted(PLANTED))
def test_the_solution_passes(exercise_id):
    verdict = grade(exercise_id, solution(exercise_id))
    assert verdict.ok, verdict.message


@pytest.mark.parametrize("exercise_id, mistake", [(e, m) for e, ms in PLANTED.items() for m in ms])
def test_a_planted_mistake_is_named(exercise_id, mistake):
    answer, words = PLANTED[exercise_id][mistake]
    verdict = grade(exercise_id, answer)
    assert not verdict.ok and words in verdict.message, verdict.message
    assert "\n" not in verdict.message


def test_the_learners_rule_and_encode_drive_the_package_to_its_own_results():
    count_pairs, merge = solution("16.merge_rule")
    words = T.word_counts(SMALL_TEXT * 5)
    merges = T.train(words, 320, count=count_pairs, rewrite=merge)
    assert merges == T.train(words, 320)
    theirs = T.Tokenizer(merges, encode_chunk=solution("16.encode"))
    ours = T.Tokenizer(merges)
    assert np.array_equal(theirs.encode(SMALL_TEXT), ours.encode(SMALL_TEXT))

"""Lesson 16's answers drive the package: the learner's merge rule runs the incremental trainer
to the package's merges, and the learner's encode gives the package's ids (the graders and their
planted mistakes are tested with every lesson's, in test_exercises.py)."""

from __future__ import annotations

import numpy as np

from smallem import tokens as T
from smallem.course import solution
from smallem.course.l16_tokens.exercises import SMALL_TEXT


def test_the_learners_rule_and_encode_drive_the_package_to_its_own_results():
    count_pairs, merge = solution("16.merge_rule")
    words = T.word_counts(SMALL_TEXT * 5)
    merges = T.train(words, 320, count=count_pairs, rewrite=merge)
    assert merges == T.train(words, 320)
    theirs = T.Tokenizer(merges, encode_chunk=solution("16.encode"))
    ours = T.Tokenizer(merges)
    assert np.array_equal(theirs.encode(SMALL_TEXT), ours.encode(SMALL_TEXT))

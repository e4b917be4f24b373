"""Issue 27's rule for lessons 14-16, an accepted answer keeps the notebook running: answers
each grader accepted before while the next cell failed on them (or its verdict said what was
not so), reproduced with that cell's own code (written to fail before the graders named them)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from smallem import tokens as bpe
from smallem.autodiff import Attention, Tape
from smallem.autodiff.operations import softmax
from smallem.course import EXERCISES, grade
from smallem.course.l14_precision.exercises import bf16_reference

LESSONS = ("14", "15", "16")


def test_lessons_14_to_16_give_every_exercise_a_second_answer():
    ids = [e for e in EXERCISES if e[:2] in LESSONS]
    assert len(ids) == 9 and all(EXERCISES[e].alternate_cell for e in ids)


def _online_update32(m, total, acc, s, v):
    """Right, but in float32: notebook 15's next cell compares the tiled forward to 1e-12."""
    m, total, acc, s, v = (np.asarray(a, np.float32) for a in (m, total, acc, s, v))
    m_new = np.maximum(m, s.max(-1, keepdims=True))
    alpha, p = np.exp(m - m_new), np.exp(s - m_new)
    return m_new, total * alpha + p.sum(-1, keepdims=True), acc * alpha + p @ v


def test_the_next_cell_cannot_use_a_float32_online_update():
    """What notebook 15 runs after `use("15.online_update", ...)`: it fails on this answer."""
    rng = np.random.default_rng(15)
    q, k, v = (rng.normal(size=(2, 4, 100, 32)) for _ in range(3))
    tape = Tape("cpu64")
    mine = tape.apply(Attention(tile=16, update=lambda be, *a: _online_update32(*a)),
                      [tape.constant(a) for a in (q, k, v)])
    scores = tape.div(tape.constant(q) @ tape.transpose(tape.constant(k)), float(np.sqrt(32)))
    reference = softmax(tape, scores, causal=True) @ tape.constant(v)
    assert not np.allclose(mine.value, reference.value, rtol=0, atol=1e-12)


def test_a_float32_online_update_is_named_not_accepted():
    verdict = grade("15.online_update", _online_update32)
    assert not verdict.ok and "float32" in verdict.message, verdict.message


def _pairs_most_common(words):
    """The right counts, handed back sorted as (pair, count) tuples, most frequent first."""
    pairs = Counter()
    for word, times in words.items():
        for p in zip(word, word[1:]):
            pairs[p] += times
    return pairs.most_common()


def test_the_next_cell_cannot_use_pairs_counted_as_a_list():
    """Notebook 16 trains with `count=count_pairs` itself: a list of (pair, count) has no .items()."""
    words = bpe.word_counts(b"def f(self):\n    return self.value\n")
    assert dict(_pairs_most_common(dict(words))) == dict(bpe.count_pairs(dict(words)))  # counts right
    with pytest.raises(AttributeError):
        bpe.train(words, 270, count=_pairs_most_common, rewrite=bpe.merge)


def test_pairs_counted_as_a_list_are_named_not_accepted():
    verdict = grade("16.merge_rule", (_pairs_most_common, bpe.merge))
    assert not verdict.ok and "dict" in verdict.message and "list" in verdict.message, verdict.message


def test_a_counter_or_a_plain_dict_of_pairs_is_accepted():
    """Any mapping {pair: count} is what the training reads: the refusal above is for lists only."""
    def as_dict(words):
        return dict(bpe.count_pairs(words))
    assert grade("16.merge_rule", (as_dict, bpe.merge)).ok
    assert grade("16.merge_rule", (bpe.count_pairs, bpe.merge)).ok  # a Counter


def test_a_float64_master_is_named_not_accepted():
    """The lesson keeps its master weights in float32; a float64 master was accepted, and its
    verdict said "the master keeps every step in float32"."""
    def master_update(master, grad, lr):
        new = master.astype(np.float64) - lr * grad
        return new, bf16_reference(new)
    verdict = grade("14.master_update", master_update)
    assert not verdict.ok and "float64" in verdict.message, verdict.message


def _to_bf16_in_place(x):
    """Right values, but += and &= on x.view(np.uint32) round x itself (the view shares its memory)."""
    u = x.view(np.uint32)
    u += 0x7FFF + ((u >> 16) & 1)
    u &= 0xFFFF0000
    return x


def test_a_to_bf16_that_rounds_its_input_in_place_breaks_the_next_exercise():
    """Notebook 14's master_update calls the learner's to_bf16 on the new master: rounded in place,
    the master loses every small step, and the right solution of 14.master_update is refused."""
    namespace = {"np": np, "to_bf16": _to_bf16_in_place}
    exec(EXERCISES["14.master_update"].solution_cell, namespace)  # noqa: S102 (the cell, as run)
    master = np.float32([1.0])
    for _ in range(100):                                 # notebook 14's next cell
        master, copy = namespace["master_update"](master, np.float32([1.0]), 0.001)
    assert float(master[0]) == 1.0  # not 0.9: every step vanished
    assert not grade("14.master_update", namespace["master_update"]).ok


def test_a_to_bf16_that_rounds_its_input_in_place_is_named_not_accepted():
    verdict = grade("14.to_bf16", _to_bf16_in_place)
    assert not verdict.ok and "in place" in verdict.message, verdict.message


def _merge_generator(word, pair, new):
    """Right ids, yielded one by one."""
    i = 0
    while i < len(word):
        if tuple(word[i:i + 2]) == pair:
            yield new
            i += 2
        else:
            yield word[i]
            i += 1


def test_the_next_exercise_cannot_use_a_merge_that_yields():
    """16.encode's second answer slices what the learner's merge gives back (its cell uses it)."""
    namespace = {"np": np, "merge": _merge_generator}
    exec(EXERCISES["16.encode"].alternate_cell, namespace)  # noqa: S102 (the cell, as run)
    with pytest.raises(TypeError):
        namespace["encode_chunk"](b"abc", {(97, 98): 0, (98, 99): 1})


def test_a_merge_that_yields_is_named_not_accepted():
    verdict = grade("16.merge_rule", (bpe.count_pairs, _merge_generator))
    assert not verdict.ok and "generator" in verdict.message and "tuple" in verdict.message, verdict.message


def test_a_cached_step_that_scales_the_cached_keys_in_place_is_named():
    """The cache hands the step its own keys: `keys /= √D` would scale them again every step."""
    def cached_step(q, keys, values):
        keys /= np.sqrt(q.shape[-1])
        scores = q @ keys.swapaxes(-1, -2)
        w = np.exp(scores - scores.max(-1, keepdims=True))
        return w / w.sum(-1, keepdims=True) @ values
    verdict = grade("16.cached_step", cached_step)
    assert not verdict.ok and "keys in place" in verdict.message, verdict.message

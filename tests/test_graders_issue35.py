"""Issue 35's false accepts in lessons 15 and 16, each reproduced as a learner wrote it: every one
is refused with a sentence naming the mistake (written to fail before the fix)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from smallem import tokens as T
from smallem.course import grade

# -- 16.encode: the order of merges -----------------------------------------------------------

def _encode_most_frequent_first(chunk, rank):
    ids = list(chunk)
    while len(ids) >= 2:
        counts = Counter(p for p in zip(ids, ids[1:]) if p in rank)
        if not counts:
            break
        pair = max(counts, key=lambda p: (counts[p], -rank[p]))
        ids = list(T.merge(ids, pair, 257 + rank[pair]))
    return ids


def _encode_greedy_from_the_left(chunk, rank):
    ids = list(chunk)
    while True:
        for i in range(len(ids) - 1):
            if (ids[i], ids[i + 1]) in rank:
                pair = (ids[i], ids[i + 1])
                ids = list(T.merge(ids, pair, 257 + rank[pair]))
                break
        else:
            return ids


def test_encode_that_merges_the_most_frequent_pair_first_is_refused():
    verdict = grade("16.encode", _encode_most_frequent_first)
    assert not verdict.ok and "most frequent" in verdict.message, verdict.message


def test_encode_that_merges_greedily_from_the_left_is_refused():
    verdict = grade("16.encode", _encode_greedy_from_the_left)
    assert not verdict.ok and "from the left" in verdict.message, verdict.message


# -- 16.merge_rule: a merge on the ids written out as text ----------------------------------------

def _merge_as_text(word, pair, new):
    text = " ".join(map(str, word)).replace(" ".join(map(str, pair)), str(new))
    return tuple(int(t) for t in text.split()) if text else ()


def _merge_as_digits(word, pair, new):
    text = "".join(map(str, word)).replace("".join(map(str, pair)), str(new))
    return tuple(int(t) for t in text) if text else ()


def test_a_merge_that_replaces_the_ids_written_as_text_is_refused():
    assert _merge_as_digits((21, 11), (1, 11), 300) == (2, 3, 0, 0)  # 2111 -> 2300, digit by digit
    for wrong in (_merge_as_text, _merge_as_digits):
        verdict = grade("16.merge_rule", (T.count_pairs, wrong))
        assert not verdict.ok and "as text" in verdict.message, verdict.message


# -- 15.attention_bytes: the default itemsize, and which tensor is missing --------------------------

def test_attention_bytes_with_a_float64_default_is_refused():
    def eight_by_default(B, T, C, H, itemsize=8):
        return itemsize * (10 * B * T * C + 3 * B * H * T * T)
    verdict = grade("15.attention_bytes", eight_by_default)
    assert not verdict.ok and "itemsize=4" in verdict.message, verdict.message


def test_attention_bytes_says_which_tensor_is_missing():
    def no_bias_output(B, T, C, H, itemsize=4):  # one (B, T, C) tensor forgotten
        return itemsize * (9 * B * T * C + 3 * B * H * T * T)
    def two_matrices(B, T, C, H, itemsize=4):  # one (B, H, T, T) tensor forgotten
        return itemsize * (10 * B * T * C + 2 * B * H * T * T)
    one = grade("15.attention_bytes", no_bias_output)
    two = grade("15.attention_bytes", two_matrices)
    assert not one.ok and "one (B, T, C) tensor" in one.message, one.message
    assert not two.ok and "two (B, H, T, T)" in two.message, two.message


# -- 16.cached_step without the max shift, 15.online_update without the -inf guard ---------------

def test_cached_step_without_the_max_shift_is_refused():
    def no_shift(q, keys, values):
        w = np.exp(q @ keys.swapaxes(-1, -2) / np.sqrt(q.shape[-1]))
        return (w / w.sum(-1, keepdims=True)) @ values
    verdict = grade("16.cached_step", no_shift)
    assert not verdict.ok and "the row's max" in verdict.message, verdict.message


def test_online_update_without_a_guard_for_a_row_still_at_minus_infinity_is_refused():
    def unguarded(m, total, acc, s, v):
        m_new = np.maximum(m, s.max(-1, keepdims=True))
        alpha, p = np.exp(m - m_new), np.exp(s - m_new)
        return m_new, total * alpha + p.sum(-1, keepdims=True), acc * alpha + p @ v
    with np.errstate(all="ignore"):
        verdict = grade("15.online_update", unguarded)
    assert not verdict.ok and "still −∞" in verdict.message, verdict.message


# -- 14.to_bf16: NaN stays NaN ----------------------------------------------------------------------

def test_to_bf16_keeps_every_nan_a_nan_and_the_alternate_runs_on_all_ones():
    from smallem.course import EXERCISES
    from smallem.course.l14_precision.exercises import bf16_reference
    ex = EXERCISES["14.to_bf16"]
    bits = np.concatenate([np.arange(0x7F800000, 0x80000000, 0x10001, dtype=np.uint64),
                           np.arange(0xFF800000, 0x100000000, 0x10001, dtype=np.uint64),
                           [0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0xFF808000]]).astype(np.uint32)
    x = bits.view(np.float32)
    for answer in (ex.solution(), ex.solution(ex.alternate_cell)):
        got = np.asarray(answer(x.copy()), np.float32)
        assert np.array_equal(np.isnan(got), np.isnan(x))
        want = bf16_reference(x)
        assert np.array_equal(got[~np.isnan(x)], want[~np.isnan(x)])  # ±inf stay themselves


def test_to_bf16_that_turns_a_nan_into_inf_or_zero_is_refused():
    def unguarded(x):
        u = x.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    verdict = grade("14.to_bf16", unguarded)
    assert not verdict.ok and "keep a NaN a NaN" in verdict.message, verdict.message


# -- leftovers of lessons 11 and 12 ----------------------------------------------------------------

def test_transpose_given_a_permutation_says_so_in_one_sentence():
    import pytest

    from smallem import Tape
    from smallem.errors import SmallemError
    tape = Tape("cpu64")
    y = tape.leaf(np.zeros((2, 3, 4, 5)))
    with pytest.raises(SmallemError, match="one number"):
        tape.transpose(y, (0, 2, 1, 3))
    assert tape.transpose(y, 1, 2).shape == (2, 4, 3, 5)


# -- the hint a ✗ appends is the one about the part that is wrong -----------------------------------

def _hint_shown(exercise_id, answer):
    from smallem.course import EXERCISES
    message = grade(exercise_id, answer).message
    return [k + 1 for k, text in enumerate(EXERCISES[exercise_id].hints) if text in message]


def test_a_wrong_merge_gets_the_hint_about_merge_not_count_pairs():
    assert _hint_shown("16.merge_rule", (T.count_pairs, _merge_as_text)) == [2]


def test_a_missing_score_matrix_gets_the_hint_that_lists_all_three():
    def two_matrices(B, T, C, H, itemsize=4):
        return itemsize * (10 * B * T * C + 2 * B * H * T * T)
    from smallem.course import EXERCISES
    assert _hint_shown("15.attention_bytes", two_matrices) == [2]
    assert "three" in EXERCISES["15.attention_bytes"].hints[1].lower()


def test_a_cached_step_without_the_shift_gets_the_hint_about_the_shift():
    def no_shift(q, keys, values):
        w = np.exp(q @ keys.swapaxes(-1, -2) / np.sqrt(q.shape[-1]))
        return (w / w.sum(-1, keepdims=True)) @ values
    assert _hint_shown("16.cached_step", no_shift) == [2]


def test_every_planted_mistake_of_14_to_16_appends_the_hint_its_sentence_maps_to():
    from smallem.course import EXERCISES
    for exercise_id in [i for i in EXERCISES if i[:2] in ("14", "15", "16")]:
        ex = EXERCISES[exercise_id]
        for name, (wrong, _) in ex.mistakes.items():
            with np.errstate(all="ignore"):
                message = grade(exercise_id, wrong).message
            sentence = message.split(" Hint")[0]
            assert ex.hints[ex.hint_about(sentence) - 1] in message, (exercise_id, name, message)

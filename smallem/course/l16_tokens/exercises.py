"""Lesson 16, from bytes to tokens: the merge rule (count adjacent pairs, merge one pair), encode
by merge rank, and one cached attention step, each graded against the package (smallem.tokens,
the uncached causal head of lesson 11) on small inputs."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ... import tokens as T
from ..common.graders import Wrong, call, compare
from ..common.grading import exercise
from ..common.references import head_reference

SMALL_TEXT = (b"def f(self):\n    return self.value\n\ndef g(self, value):\n"
              b"    self.value = value\n    return value\n")


# planted wrong answers (the tests feed them to the graders) ----------------------------------
def _count_once(words):
    """Each pair once per word, whatever the word's count."""
    return T.count_pairs({w: 1 for w in words})


def _merge_right_to_left(word, pair, new):
    return tuple(reversed(T.merge(tuple(reversed(word)), pair[::-1], new)))


def _encode_last_merge_first(chunk, rank):
    ids = list(chunk)
    for pair in sorted(rank, key=rank.get, reverse=True):
        ids = list(T.merge(ids, pair, T.FIRST_MERGE + rank[pair]))
    return ids


def _step(scale: bool = True, own_only: bool = False):
    def cached_step(q, keys, values):
        if own_only:
            return values[..., -1:, :]
        scores = q @ keys.swapaxes(-1, -2) / (np.sqrt(q.shape[-1]) if scale else 1.0)
        w = np.exp(scores - scores.max(-1, keepdims=True))
        return (w / w.sum(-1, keepdims=True)) @ values
    return cached_step


# -- 16.merge_rule -----------------------------------------------------------------------------

@exercise("16.merge_rule", title="the merge rule: count adjacent pairs, merge the most frequent",
          hints=("count_pairs: for each word and its count, every adjacent pair (word[i], word[i+1]) "
                 "gets `count` added; zip(word, word[1:]) walks them.",
                 "merge: walk the word left to right; where word[i], word[i+1] is the pair, emit "
                 "`new` and jump two, else emit word[i] and move one.",
                 "In 'aaa' the pair (a, a) is merged once, at the left: (new, a). Return a tuple."),
          hint_for={"count_pairs": 1, "counted": 1, "as text": 2, "cut at the left": 3, "merge": 2},
          answer=("count_pairs", "merge"),
          mistakes={"pairs counted once per word": ((_count_once, T.merge), "counted once per word"),
                    "merged from the right": ((T.count_pairs, _merge_right_to_left), "cut at the left")},
          alternate_cell='''
# Exercise 16.merge_rule · the two halves of one BPE step
from collections import Counter

def count_pairs(words):
    pairs = Counter()
    for word, times in words.items():
        for i in range(len(word) - 1):
            pairs[word[i], word[i + 1]] += times
    return pairs

def merge(word, pair, new):
    out = []
    for token in word:
        if out and (out[-1], token) == pair:   # the pair ends here: the last id kept is its first half
            out[-1] = new
        else:
            out.append(token)
    return out
''', solution_cell='''
# Exercise 16.merge_rule · the two halves of one BPE step
def count_pairs(words):
    """words {tuple of ids: count}. Return {(a, b): how often a is followed by b}."""
    pairs = {}
    for word, count in words.items():
        for pair in zip(word, word[1:]):                 # every adjacent pair, once per occurrence
            pairs[pair] = pairs.get(pair, 0) + count     # a word seen 40 times counts 40 times
    return pairs

def merge(word, pair, new):
    """word (tuple of ids) with every (a, b) of `pair`, left to right, replaced by `new`."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(new)                              # the pair becomes one id
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)
''')
def merge_rule(answer):
    count_pairs, merge = answer
    words = {(1, 2, 3): 2, (2, 3): 5, (3,): 7, (4, 4, 4): 1}
    got = call(count_pairs, dict(words), on="words {(1, 2, 3): 2, (2, 3): 5, (3,): 7, (4, 4, 4): 1}")
    if not isinstance(got, Mapping):  # the lesson's training reads it by pair: .items(), .get
        raise Wrong(f"count_pairs returns a {type(got).__name__}: return the dict {{(a, b): count}} "
                    "itself (a Counter is one), which the training looks pairs up in.")
    got = dict(got)
    want = dict(T.count_pairs(words))
    if got == dict(T.count_pairs({w: 1 for w in words})) or got == {p: 1 for p in want}:
        raise Wrong("each pair is counted once per word, not `count` times: a word that occurs 5 "
                    "times holds its pairs 5 times.")
    if got != want:
        bad = next(p for p in set(want) | set(got) if got.get(p) != want.get(p))
        raise Wrong(f"pair {bad} is counted {got.get(bad, 0)} times where it occurs {want.get(bad, 0)} "
                    "times (in {(1, 2, 3): 2, (2, 3): 5, (3,): 7, (4, 4, 4): 1}).")
    for word, pair in [((21, 11), (1, 11)), ((112, 1, 12), (1, 12)), ((1, 2, 1, 2, 2), (1, 2)),
                       ((5, 5, 5), (5, 5)), ((5, 5, 5, 5), (5, 5)), ((1,), (1, 2)), ((), (1, 2)),
                       ((2, 1), (1, 2))]:
        out = call(merge, word, pair, 300, on=f"word {word}, pair {pair}")
        if not isinstance(out, (tuple, list, np.ndarray)):  # encode, next, slices what merge gives
            raise Wrong(f"merge returns a {type(out).__name__}: return the ids themselves, a tuple "
                        "(tuple(...) of what you built), which the next exercise's encode can index.")
        out = tuple(out)
        if out != T.merge(word, pair, 300) and word in ((21, 11), (112, 1, 12)):
            raise Wrong(f"merge({word}, {pair}, 300) gives {out} where it should be "
                        f"{T.merge(word, pair, 300)}: "
                        "the ids are matched as text, and 21, 11 written out holds 1, 11; compare the "
                        "ids themselves, (word[i], word[i + 1]) == pair.")
        if out != T.merge(word, pair, 300):
            hint = (" Merged left to right, an overlapping run of a pair (a, a) is cut at the left: "
                    "'aaa' is (new, a)." if pair == (5, 5) else "")
            raise Wrong(f"merge({word}, {pair}, 300) gives {out} where it should be "
                        f"{T.merge(word, pair, 300)}.{hint}")
    words = T.word_counts(SMALL_TEXT)
    ours = T.train(words, 300, count=lambda w: dict(count_pairs(w)), rewrite=merge)
    want_merges = T.train_reference(words, 300)
    if ours != want_merges:
        k = next(i for i, (a, b) in enumerate(zip(ours, want_merges)) if a != b)
        raise Wrong(f"on a small text, merge {k} learnt with your rule is {ours[k]} where the "
                    f"package learns {want_merges[k]}.")
    return f"your rule learns the package's {len(ours)} merges on a small text"


# -- 16.encode ---------------------------------------------------------------------------------

def _most_frequent_first(chunk, rank):
    """The mistake: the chunk's most frequent learnt pair first (ties: the first seen)."""
    ids = list(chunk)
    while True:
        seen = [p for p in zip(ids, ids[1:]) if p in rank]
        if not seen:
            return ids
        pair = max(seen, key=seen.count)
        ids = list(T.merge(ids, pair, T.FIRST_MERGE + rank[pair]))


def _leftmost_first(chunk, rank):
    """The mistake: the first learnt pair from the left, whatever its rank."""
    ids = list(chunk)
    while True:
        pair = next((p for p in zip(ids, ids[1:]) if p in rank), None)
        if pair is None:
            return ids
        ids = list(T.merge(ids, pair, T.FIRST_MERGE + rank[pair]))


# The order cases: (chunk, merges in the order learnt, what they name). In b"abcbc", ab is learnt
# first but bc occurs twice; in b"abc" with bc learnt first, the leftmost learnt pair is ab.
_ORDER = ((b"abc", [(97, 98), (98, 99)], "merges ab then bc"),
          (b"abcbc", [(97, 98), (98, 99)], "merges ab then bc"),
          (b"abc", [(98, 99), (97, 98)], "merges bc then ab"))


@exercise("16.encode", title="encode: merge the pair learnt first, again and again",
          hints=("Start from the chunk's bytes, list(chunk). Among its adjacent pairs, find the one "
                 "with the smallest rank (rank.get(pair) is None for a pair never merged).",
                 "min(zip(ids, ids[1:]), key=lambda p: rank.get(p, math.inf)); if that pair is not "
                 "in rank, stop.",
                 "Merge it everywhere with id 257 + rank[pair] (the merge function of the last "
                 "exercise), and repeat while two ids or more are left."),
          answer="encode_chunk", env={"merge": T.merge},
          mistakes={"the last merge first": (_encode_last_merge_first, "in the order they were learnt"),
                    "bytes only": (lambda chunk, rank: list(chunk), "should be [257, 99]"),
                    "the most frequent pair first": (_most_frequent_first, "most frequent pair first"),
                    "the leftmost learnt pair first": (_leftmost_first, "first learnt pair from the left")},
          alternate_cell='''
# Exercise 16.encode · one chunk's bytes -> its ids, merges applied in the order learnt
def encode_chunk(chunk, rank):
    ids = list(chunk)
    while True:
        learnt = [pair for pair in zip(ids, ids[1:]) if pair in rank]
        if not learnt:
            return ids
        first = min(learnt, key=lambda pair: rank[pair])
        ids = merge(ids, first, 257 + rank[first])
''', solution_cell='''
# Exercise 16.encode · one chunk's bytes -> its ids, merges applied in the order learnt
def encode_chunk(chunk, rank):
    """chunk (bytes), rank {(a, b): k} (merge k made id 257 + k). Return the list of ids."""
    ids = list(chunk)
    while len(ids) >= 2:
        pair = min(zip(ids, ids[1:]), key=lambda p: rank.get(p, math.inf))  # learnt first
        if pair not in rank:
            break                                        # no pair left that was ever merged
        ids = list(merge(ids, pair, 257 + rank[pair]))
    return ids
''')
def encode(answer):
    tokenizer = T.Tokenizer(T.train(SMALL_TEXT * 3, 320))
    for chunk, merges, learnt in _ORDER:
        rank = dict(T.Tokenizer(merges).rank)
        on = f"chunk {chunk!r}, {learnt}"
        got = [int(i) for i in call(answer, chunk, dict(rank), on=on)]
        want = T.Tokenizer(merges).encode_chunk(chunk)
        if got == want:
            continue
        if got == _leftmost_first(chunk, rank):
            raise Wrong(f"{on}: your encode merges the first learnt pair from the left and gives {got} "
                        f"where it should be {want}; among all the chunk's pairs, merge the one learnt "
                        "first (the lowest rank), wherever it sits.")
        if got == _most_frequent_first(chunk, rank):
            raise Wrong(f"{on}: your encode merges the chunk's most frequent pair first and gives {got} "
                        f"where it should be {want}; merges are applied in the order they were learnt "
                        "(the lowest rank first), whatever the chunk's own counts.")
        if chunk == b"abc" and got == [97, T.FIRST_MERGE + 1] and merges[0] == (97, 98):
            raise Wrong("b'abc' became a(bc): merges are applied in the order they were learnt, and "
                        "ab was learnt before bc, so it is (ab)c = [257, 99].")
        raise Wrong(f"{on}: your encode gives {got} where it should be {want}.")
    for chunk in T.chunks(SMALL_TEXT) + [b"", b"\xff\x00", b"    self.value"]:
        got = [int(i) for i in call(answer, chunk, dict(tokenizer.rank), on=f"chunk {chunk!r}")]
        want = tokenizer.encode_chunk(chunk)
        if got != want:
            raise Wrong(f"chunk {chunk!r} encodes to {got} where the package gives {want}.")
    return "your ids equal the package's on every chunk of a small text"


def _softmax_rows(q, keys, values):
    scores = q @ keys.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ values


def _cached_mistakes(q, keys, values):
    """(what a common mistake gives, the sentence naming it) for one cached step."""
    scores = q @ keys.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return ((values.sum(-2, keepdims=True), "the softmax runs over the wrong axis: over the query's one "
             "row every weight is 1, so the values are summed; take it over the keys, the last axis"),
            (_softmax_rows(q, values, keys), "keys and values are swapped: the query scores the keys, "
             "and the weights average the values"),
            (e @ values, "the weights are not normalised: divide exp(scores − max) by its sum over the "
             "keys, so that they add up to 1"))


# -- 16.cached_step ----------------------------------------------------------------------------

@exercise("16.cached_step", title="one cached attention step: the new row against every key",
          hints=("The new position's query q (..., 1, D) scores every key of the cache, its own "
                 "included: q @ keys.swapaxes(-1, -2), scaled by 1/√D.",
                 "No mask: the new position is the last one, and every key is in its past. A "
                 "softmax over the last axis (subtract the row's max first) gives the weights.",
                 "Return weights @ values, shape (..., 1, D)."),
          hint_for={'√D': 1, 'own value': 1, 'keys and values are swapped': 1, "row's max": 2,
                    'wrong axis': 2, 'not normalised': 2, 'shape': 3},
          answer="cached_step",
          mistakes={"no 1/√D": (_step(scale=False), "not divided by √D"),
                    "its own value only": (_step(own_only=True), "new position's own value"),
                    "the wrong axis": (lambda q, k, v: v.sum(-2, keepdims=True), "the wrong axis"),
                    "keys and values swapped": (lambda q, k, v: _softmax_rows(q, v, k),
                                                "keys and values are swapped"),
                    "not normalised": (lambda q, k, v: (lambda s: np.exp(s - s.max(-1, keepdims=True)) @ v)(
                        q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])), "not normalised"),
                    "no max shift": (lambda q, k, v: (lambda w: (w / w.sum(-1, keepdims=True)) @ v)(
                        np.exp(q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]))), "the row's max")},
          alternate_cell='''
# Exercise 16.cached_step · the new position's output, from the keys and values kept so far
def cached_step(q, keys, values):
    scores = np.einsum("...qd,...kd->...qk", q, keys) * q.shape[-1] ** -0.5
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return np.einsum("...qk,...kd->...qd", e / e.sum(axis=-1, keepdims=True), values)
''', solution_cell='''
# Exercise 16.cached_step · the new position's output, from the keys and values kept so far
def cached_step(q, keys, values):
    """q (..., 1, D); keys, values (..., L, D), the new position's last. Return (..., 1, D)."""
    scores = q @ keys.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (..., 1, L): no mask needed
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights @ values                                       # (..., 1, D)
''')
def cached_step(answer):
    rng = np.random.default_rng(16)
    for on, (t, c, d) in (("T = 6 positions of C = 5, D = 4", (6, 5, 4)),
                          ("T = 1 (the first position)", (1, 5, 3))):
        x = rng.normal(size=(t, c))
        wq, wk, wv = (rng.normal(size=(c, d)) for _ in range(3))
        want = head_reference(x, wq, wk, wv)[-1:]  # the uncached head's last row
        q, keys, values = (x @ wq)[-1:], x @ wk, x @ wv
        given = [a.copy() for a in (q, keys, values)]
        got = np.asarray(call(answer, *given, on=on), dtype=np.float64)
        for name, a, b in (("keys", given[1], keys), ("values", given[2], values)):
            if not np.array_equal(a, b):  # the cache's own arrays: every later step reads them
                raise Wrong(f"cached_step changed {name} in place ({on}): the cache hands you its own "
                            "keys and values, which every later step reads again; compute into new "
                            "arrays (scores = q @ ... / √D) instead of /= or -=.")
        if got.shape != want.shape:
            raise Wrong(f"the output has shape {list(got.shape)} where it should be {list(want.shape)} "
                        f"({on}): one row, D numbers.")
        for wrong, why in _cached_mistakes(q, keys, values):
            if t > 1 and np.allclose(got, wrong) and not np.allclose(got, want):
                raise Wrong(f"{why} ({on}).")
        no_scale = head_reference(x, wq, wk, wv, scale=False)[-1:]
        if t > 1 and np.allclose(got, no_scale) and not np.allclose(got, want):
            raise Wrong(f"the scores are not divided by √D ({on}): the uncached head scales them.")
        if t > 1 and np.allclose(got, values[-1:]):
            raise Wrong(f"the output is the new position's own value ({on}): its query must score "
                        "every key in the cache, not only its own.")
        compare("the new row", got, want, on=on, source="the uncached head's last row is",
                tolerance=1e-10)
    # large scores: exp overflows past 709 in float64 (past 88 in the model's float32) unless the
    # row's max is taken off first
    big = rng.normal(size=(1, 1, 1, 16)), rng.normal(size=(1, 1, 9, 16)), rng.normal(size=(1, 1, 9, 16))
    big[1][...] *= 900 / np.abs(big[0] @ big[1].swapaxes(-1, -2) / 4).max()  # the largest score ±900
    on = "scores up to about a thousand"
    got = np.asarray(call(answer, *(a.copy() for a in big), on=on), dtype=np.float64)
    if got.shape == big[0].shape and not np.all(np.isfinite(got)):
        raise Wrong(f"your step gives {got.ravel()[0]} for {on}: exp overflows there; subtract the row's "
                    "max from the scores before exp (the softmax is unchanged by it, and the largest "
                    "exponent is then 0).")
    compare("the new row", got, _softmax_rows(big[0], big[1], big[2]), on=on, source="it should be",
            tolerance=1e-10)
    batch = rng.normal(size=(2, 3, 1, 4)), rng.normal(size=(2, 3, 7, 4)), rng.normal(size=(2, 3, 7, 4))
    got = np.asarray(call(answer, *batch, on="(B, H) = (2, 3) in front"), dtype=np.float64)
    scores = batch[0] @ batch[1].swapaxes(-1, -2) / 2.0  # √D = 2: every key, no mask
    w = np.exp(scores - scores.max(-1, keepdims=True))
    want = (w / w.sum(-1, keepdims=True)) @ batch[2]
    compare("the batched rows", got, want, on="(B, H) = (2, 3) in front", tolerance=1e-10)
    return "your step gives the uncached head's last row, for one head and for (B, H) of them"

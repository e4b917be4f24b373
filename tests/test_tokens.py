"""The BPE tokenizer: merges equal to the slow reference's, the boundary never merged, an exact
round trip on 10,000 fuzzed byte strings, and merges files saved atomically and refused in
one sentence when they are not smallem's."""

import json
from pathlib import Path

import numpy as np
import pytest

from smallem import SmallemError
from smallem import tokens as T
from smallem.data import BOUNDARY

SOURCE = Path(T.__file__).read_bytes() + Path(T.__file__).with_name("data.py").read_bytes()


@pytest.fixture(scope="module")
def tokenizer():
    return T.Tokenizer(T.train(SOURCE, 600))


def test_merges_equal_the_slow_reference_on_real_text():
    words = T.word_counts(SOURCE)
    fast, slow = T.train(words, 700), T.train_reference(words, 700)
    assert len(fast) == 700 - 257
    assert fast == slow


def test_ties_go_to_the_smallest_pair_in_both_trainers():
    words = {b"abab": 1, b"cdcd": 1, b"ba": 1}  # (a,b) and (b,a) and (c,d) tie at first
    fast, slow = T.train(words, 262), T.train_reference(words, 262)
    assert fast == slow
    assert fast[0] == (ord("a"), ord("b"))


def test_a_merge_rewrites_each_word_that_holds_the_pair():
    assert T.merge((1, 2, 1, 2, 2), (1, 2), 300) == (300, 300, 2)
    assert T.merge((5, 5, 5), (5, 5), 300) == (300, 5)  # left to right, no overlap
    assert T.count_pairs({(1, 2, 1): 3, (2, 1): 1}) == {(1, 2): 3, (2, 1): 4}


def test_training_stops_when_no_pair_is_left():
    assert T.train({b"ab": 5}, 2048) == [(97, 98)]


def test_the_boundary_is_never_merged_nor_crossed():
    stream = np.array([BOUNDARY, 120, 121] * 50, dtype=np.uint16)
    merges = T.train(stream, 300)
    assert merges == [(120, 121)]  # "xy" in every document; nothing joins across a boundary
    tok = T.Tokenizer(merges)
    ids = tok.encode(stream)
    assert ids.tolist() == [BOUNDARY, 257] * 50
    assert np.array_equal(tok.decode(ids), stream)


def test_encode_applies_merges_in_the_order_learnt():
    tok = T.Tokenizer([(97, 98), (98, 99)])  # ab first, then bc: "abc" is (ab)c, not a(bc)
    assert tok.encode(b"abc").tolist() == [257, 99]
    tok = T.Tokenizer([(98, 99), (97, 98)])
    assert tok.encode(b"abc").tolist() == [97, 257]


def test_round_trip_is_exact_on_10000_fuzzed_byte_strings(tokenizer):
    rng = np.random.default_rng(0)
    alphabet = np.frombuffer(b" \n\tdefself_()=:,.x0123\x00\xff\xc3\xa9\x80", np.uint8)
    for k in range(10_000):
        n = int(rng.integers(0, 40))
        if k % 3 == 0:  # any byte at all, invalid UTF-8 among them
            data = rng.integers(0, 256, n).astype(np.uint8).tobytes()
        else:  # text-like: the merges fire
            data = rng.choice(alphabet, n).tobytes()
        ids = tokenizer.encode(data)
        assert tokenizer.decode_bytes(ids) == data, data
        if k % 10 == 0:  # with boundaries in the stream, the stream comes back
            stream = np.frombuffer(data, np.uint8).astype(np.int64)
            stream = np.insert(stream, rng.integers(0, n + 1, 3), BOUNDARY)
            assert np.array_equal(tokenizer.decode(tokenizer.encode(stream)), stream), stream


def test_empty_input_and_text_input(tokenizer):
    assert tokenizer.encode(b"").size == 0 and tokenizer.decode_bytes([]) == b""
    assert tokenizer.decode_bytes(tokenizer.encode("naïve → ok")) == "naïve → ok".encode()
    assert tokenizer.encode("def self").size < len("def self")  # merges learnt from code fire


def test_out_of_range_ids_and_tokens_are_one_sentence(tokenizer):
    with pytest.raises(SmallemError, match="outside the vocabulary of 600"):
        tokenizer.decode([600])
    with pytest.raises(SmallemError, match="bytes .0-255. and boundaries"):
        tokenizer.encode(np.array([1, 999]))
    with pytest.raises(SmallemError, match="vocabulary of 100 cannot hold"):
        T.train(b"abc", 100)


def test_merges_file_round_trip(tmp_path, tokenizer):
    path = T.save_merges(tmp_path / "m.json", tokenizer.merges)
    assert T.load_merges(path) == tokenizer.merges
    assert not [p for p in tmp_path.iterdir() if p.name != "m.json"]  # no temp file left


@pytest.mark.parametrize("content, message", [
    (b"not json", "cannot be read .it is not JSON."),
    (b"[1, 2]", "is not a smallem merges file"),
    (json.dumps({"format": "smallem-merges", "merges": [[97, 256]]}).encode(), "merge 0 joins 256"),
    (json.dumps({"format": "smallem-merges", "merges": [[97, 300]]}).encode(), "merge 0 joins 300"),
    (json.dumps({"format": "smallem-merges", "merges": [[97]]}).encode(), "not a pair of ids"),
    (json.dumps({"format": "smallem-merges", "merges": [[97, "b"]]}).encode(), "joins 'b'"),
])
def test_a_bad_merges_file_is_one_sentence(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(SmallemError, match=message) as error:
        T.load_merges(path)
    assert "\n" not in str(error.value)


def test_a_missing_merges_file_says_what_to_do(tmp_path):
    with pytest.raises(SmallemError, match="does not exist.*--merges out"):
        T.load_merges(tmp_path / "nope.json")


def test_a_long_chunk_without_spaces_learns_the_reference_merges_and_reports_each():
    # One 20 KB word of few letters (runs like "aaaa" among them): the trainer visits only the
    # places a merge touches (it once rewrote the whole word per merge: minutes for 250 KB),
    # and still learns exactly the slow reference's merges.
    rng = np.random.default_rng(0)
    word = rng.choice(np.frombuffer(b"aabc", np.uint8), 20_000).tobytes()
    words = {word: 1, b" abc": 3, b"aaaa": 2}
    seen = []
    fast = T.train(words, 257 + 60, progress=lambda done, total: seen.append((done, total)))
    assert fast == T.train_reference(words, 257 + 60)
    assert seen == [(k, 60) for k in range(1, 61)]


def test_learning_merges_says_so_before_it_starts(corpus, monkeypatch):
    from smallem.data import load_corpus
    from smallem.training import tokenized

    lines = []
    real = tokenized.train

    def train(*args, **kwargs):
        assert any("learning 30 BPE merges" in a for a in lines)  # said before the work
        return real(*args, **kwargs)

    monkeypatch.setattr(tokenized, "train", train)
    tokenized.merges_for(load_corpus(corpus), 287, log=lines.append)
    assert "learnt 30 merges" in lines[-1]


@pytest.mark.parametrize("merges, says", [
    ("merges.json", "Tokenizer takes the merges, pairs of ids, got str 'merges.json'"),
    (Path("m.json"), "read a merges file with Tokenizer(load_merges(path))"),
    ([(97, 98.5)], "merge 0 joins 98.5"),
])
def test_a_tokenizer_of_no_merges_is_one_sentence(merges, says):
    with pytest.raises(SmallemError) as refused:
        T.Tokenizer(merges)
    assert says in str(refused.value)


def test_fractional_ids_and_a_lone_surrogate_are_one_sentence(tokenizer):
    with pytest.raises(SmallemError, match="the ids must be whole numbers, got 2.5"):
        tokenizer.decode([97, 2.5])
    with pytest.raises(SmallemError, match="the ids must be whole numbers"):
        tokenizer.decode_bytes([97.7])
    assert tokenizer.decode_bytes([97.0, 98.0]) == b"ab"  # whole numbers, however stored
    with pytest.raises(SmallemError, match="lone surrogate, U[+]D800 at character 2"):
        tokenizer.encode("ab\ud800c")
    assert tokenizer.decode_bytes(tokenizer.encode("r\udce9sum")) == b"r\xe9sum"  # PEP 383's bytes

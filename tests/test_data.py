"""Byte tokens, the default corpus, user corpora and their clear errors, the split by document,
and batches that resume exactly from a saved generator state."""

import json

import numpy as np
import pytest

from smallem import SmallemError
from smallem.data import (BOUNDARY, BatchSampler, decode, distinct_batch, encode, fixed_batches,
                          load_corpus)


@pytest.fixture(scope="module")
def stdlib():
    return load_corpus()


def write_docs(folder, count=12, size=400):
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "value", "import", "class", "for", "in", "(x)", ":"]
    for k in range(count):
        text = " ".join(rng.choice(words, size=size // 4)) + "\n"
        (folder / f"doc{k:02d}.py").write_text(f"# document {k}\n" + text)
    return folder


def test_bytes_round_trip():
    text = "naïve café → ok"
    tokens = encode(text)
    assert tokens.dtype == np.int64 and len(tokens) == len(text.encode())
    assert decode(tokens) == text
    assert decode([104, 105, BOUNDARY, 0xC3], boundary="|") == "hi|\ufffd"  # cut UTF-8 replaced
    with pytest.raises(SmallemError, match="token 300"):
        decode([300])


def test_default_corpus_is_the_standard_library(stdlib):
    assert stdlib.source.startswith("stdlib:")
    assert 5_000_000 < stdlib.bytes <= 8_100_000
    assert all(n.endswith(".py") for n in stdlib.names)
    folders = {part for n in stdlib.names for part in n.split("/")[:-1]}
    assert not folders & {"site-packages", "test", "tests", "__pycache__", "encodings"}
    assert stdlib.names == sorted(stdlib.names)
    for stream in (stdlib.train, stdlib.held_out):
        assert stream.dtype == np.uint16 and stream[0] == BOUNDARY and stream.max() <= BOUNDARY


def test_split_is_by_document_deterministic_and_about_a_tenth(stdlib):
    assert 0.09 <= stdlib.held_out.size / stdlib.bytes <= 0.11
    held = set(stdlib.held_out_names)
    assert held and held < set(stdlib.names)
    boundaries = int((stdlib.train == BOUNDARY).sum() + (stdlib.held_out == BOUNDARY).sum())
    assert boundaries == len(stdlib.names)  # every document once, in exactly one part
    again = load_corpus()
    assert again.fingerprint() == stdlib.fingerprint() and again.held_out_names == stdlib.held_out_names


def test_folder_corpus_skips_hidden_and_binary_files(tmp_path):
    write_docs(tmp_path)
    (tmp_path / ".hidden.py").write_text("secret " * 100)
    (tmp_path / "image.png").write_bytes(b"\x89PNG\x00\x00" * 100)
    corpus = load_corpus(tmp_path)
    assert corpus.names == [f"doc{k:02d}.py" for k in range(12)]
    assert corpus.held_out_names and set(corpus.held_out_names) < set(corpus.names)


def test_single_file_is_split_inside_its_stream(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("It was a dark and stormy night. " * 100)
    corpus = load_corpus(path)
    assert corpus.train.size + corpus.held_out.size == 3201
    assert corpus.held_out.size == 3201 - int(3201 * 0.9)


@pytest.mark.parametrize("setup, message", [
    (lambda d: d / "missing", "does not exist"),
    (lambda d: d, "holds no text file"),
    (lambda d: (d / "a.bin").write_bytes(b"\x00\x01" * 900) and d / "a.bin", "looks binary"),
    (lambda d: (d / "a.txt").write_text("short") and d / "a.txt", "only 5 bytes"),
])
def test_bad_corpora_are_one_clear_error(tmp_path, setup, message):
    path = setup(tmp_path)
    with pytest.raises(SmallemError, match=message) as info:
        load_corpus(path)
    assert str(path) in str(info.value)


def test_batches_are_windows_of_the_stream():
    tokens = np.arange(1000, dtype=np.uint16) % 257
    contexts, targets = BatchSampler(tokens, batch=8, context=16, seed=1).next()
    assert contexts.shape == (8, 16) and targets.shape == (8,)
    assert contexts.dtype == np.int64 and targets.dtype == np.int64
    # each target is the token right after its context
    np.testing.assert_array_equal((contexts[:, -1] + 1) % 257, targets)
    np.testing.assert_array_equal(np.diff(contexts, axis=1) % 257, 1)


def test_sampler_state_resumes_exactly():
    tokens = np.arange(5000, dtype=np.uint16) % 257
    a = BatchSampler(tokens, 4, seed=7)
    a.next()
    state = json.loads(json.dumps(a.state()))  # it survives JSON, as in a checkpoint
    expected = [a.next() for _ in range(3)]
    b = BatchSampler(tokens, 4, seed=123)
    b.load_state(state)
    for (x, y), (u, v) in zip(expected, (b.next() for _ in range(3))):
        np.testing.assert_array_equal(x, u)
        np.testing.assert_array_equal(y, v)
    c = BatchSampler(tokens, 4, seed=8)
    assert not np.array_equal(c.next()[0], BatchSampler(tokens, 4, seed=7).next()[0])


def test_fixed_batches_cover_the_held_out_part_the_same_way_each_time():
    tokens = np.arange(3000, dtype=np.uint16) % 257
    one, two = fixed_batches(tokens, 16, 4), fixed_batches(tokens, 16, 4)
    assert len(one) == 4 and one[0][0].shape == (16, 16)
    for (x, y), (u, v) in zip(one, two):
        np.testing.assert_array_equal(x, u)
    assert one[0][1][0] == 16 and one[-1][1][-1] == 2999 % 257  # first and last positions


def test_distinct_batch_has_no_repeated_context(stdlib):
    contexts, targets = distinct_batch(stdlib.train, 64)
    assert len({tuple(row) for row in contexts}) == 64 and targets.shape == (64,)
    with pytest.raises(SmallemError, match="distinct contexts"):
        distinct_batch(np.full(100, 32, dtype=np.uint16), 8)  # all spaces: one context


def test_sampler_refuses_what_cannot_work():
    with pytest.raises(SmallemError, match="batch size"):
        BatchSampler(np.zeros(100, np.uint16), 0)
    with pytest.raises(SmallemError, match="no room"):
        BatchSampler(np.zeros(10, np.uint16), 4)

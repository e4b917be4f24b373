"""Byte tokens, the default corpus, user corpora and their clear errors, the split by document,
and batches that resume exactly from a saved generator state."""

import json

import numpy as np
import pytest

from smallem import SmallemError
from smallem.data import BOUNDARY, BatchSampler, decode, distinct_batch, encode, fixed_batches, load_corpus


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
    (lambda d: 5, "must be a path to a text file or folder, got 5"),
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


def test_a_split_that_would_hold_out_almost_nothing_splits_inside_the_stream(tmp_path):
    """27 KB in 10 files: nine of 3 KB cannot fit in a tenth, so the old split held out the one
    10-byte file alone and training then refused it with "use a larger corpus"."""
    for k in range(9):
        (tmp_path / f"big{k}.txt").write_text(f"line {k} of a big file\n" * 130)
    (tmp_path / "tiny.txt").write_text("0123456789")
    corpus = load_corpus(tmp_path)
    assert 0.09 <= corpus.held_out.size / corpus.bytes <= 0.11
    assert len(fixed_batches(corpus.held_out, 256, 32)) == 32


def test_an_unreadable_corpus_file_is_one_sentence(tmp_path, monkeypatch):
    path = tmp_path / "book.txt"
    path.write_text("text " * 400)
    real = type(path).read_bytes

    def read_bytes(self):
        if self.name == "book.txt":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(type(path), "read_bytes", read_bytes)
    with pytest.raises(SmallemError, match="corpus file '.*book.txt' cannot be read: "
                       "permission denied; fix its permissions"):
        load_corpus(path)


def test_unreadable_files_and_folders_in_a_corpus_folder_are_named_as_skipped(tmp_path,
                                                                              monkeypatch):
    import os

    from smallem.errors import SmallemWarning

    write_docs(tmp_path)
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "secret.py").write_text("x" * 500)
    real_scandir, real_read = os.scandir, type(tmp_path).read_bytes

    def scandir(path="."):
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    def read_bytes(self):
        if self.name == "doc03.py":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(type(tmp_path), "read_bytes", read_bytes)
    with pytest.warns(SmallemWarning) as caught:
        corpus = load_corpus(tmp_path)
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2, messages
    assert "skipped corpus file 'doc03.py', which cannot be read: permission denied" in messages[0]
    assert "skipped corpus folder 'locked', which cannot be read: permission denied" in messages[1]
    assert "doc03.py" not in corpus.names and len(corpus.names) == 11

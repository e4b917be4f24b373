"""What round 17's independent sweep of the command line found (nine defects): each one now ends
in one sentence with exit status 2, never a traceback or a hang, and leaves the user's files as
they were. Every case here failed before its fix (a truncated file, a traceback, or a hang)."""

import hashlib
import json
import os
import zipfile

import numpy as np
import pytest

from smallem.data import load_corpus
from smallem.tools.cli import main

LONG = "x" * 5000  # past any file system's name limit (255 bytes)
FIFO = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """One text file of ~60 KB."""
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    rng = np.random.default_rng(0)
    path.write_text(" ".join(rng.choice(["def", "return", "self", "value", "(x):", "\n"], 12000)))
    return path


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def says(capsys, argv, sentence) -> None:
    """`smallem ARGV` exits 2 with `sentence` as its one line of error."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(f"smallem {argv[0]}: error: ") and sentence in err[-1], err
    assert "Traceback" not in "\n".join(err)


def test_a_run_that_fails_before_training_leaves_the_health_file_as_it_was(capsys, tmp_path):
    """--health was opened for writing when the monitor was built, before the corpus loaded: a
    missing corpus left a 1,092-byte health file empty."""
    health = tmp_path / "health.jsonl"
    health.write_text('{"step": 1}\n')
    missing = str(tmp_path / "missing.txt")
    says(capsys, ["train", "--steps", "1", "--corpus", missing, "--health", str(health)], "does not exist")
    assert health.read_text() == '{"step": 1}\n'


@pytest.mark.parametrize("flag", ["--health", "--json", "--save"])
def test_an_output_that_names_the_corpus_is_refused(capsys, tmp_path, text, flag):
    """`--corpus c.txt --health c.txt` emptied the corpus; --json and --save replaced it."""
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(text.read_bytes())
    before = sha(corpus)
    says(capsys, ["train", "--steps", "1", "--corpus", str(corpus), flag, str(corpus)],
         f"{flag} '{corpus}' is the file given to --corpus: writing there would replace it")
    assert sha(corpus) == before


def test_bench_json_that_names_the_corpus_is_refused(capsys, text):
    before = sha(text)
    says(capsys, ["bench", "--corpus", str(text), "--json", str(text)], "is the file given to --corpus")
    assert sha(text) == before


@pytest.mark.skipif(os.name != "posix", reason="bytes file names are POSIX's")
def test_a_corpus_file_name_that_is_not_utf_8_is_read(tmp_path, text):
    """With ten documents or more the split hashes each name: a name with a byte that is not
    UTF-8 (Python's surrogate escape) was a UnicodeEncodeError."""
    for k in range(11):
        (tmp_path / f"doc{k:02d}.txt").write_bytes(text.read_bytes()[:6000])
    try:
        (tmp_path / os.fsdecode(b"doc\xff.txt")).write_bytes(text.read_bytes()[:6000])
    except (OSError, UnicodeEncodeError):
        pytest.skip("this file system refuses a name that is not UTF-8")
    corpus = load_corpus(tmp_path)
    assert len(corpus.names) == 12 and os.fsdecode(b"doc\xff.txt") in corpus.names


def test_a_path_too_long_to_look_up_is_one_sentence(capsys):
    """Python 3.11's Path.exists() raises ENAMETOOLONG where it does not return False."""
    says(capsys, ["train", "--steps", "1", "--corpus", LONG], "path of 5,000 characters cannot be looked up")
    says(capsys, ["sample", "--checkpoint", LONG], "path of 5,000 characters cannot be looked up")


@FIFO
def test_a_pipe_or_a_device_is_no_checkpoint_and_no_corpus(capsys, tmp_path, monkeypatch):
    """A named pipe's read waits forever and /dev/zero never ends: `sample --checkpoint fifo`
    and `train --resume fifo --save x` hung; `--corpus fifo` warned of a folder '.'."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    says(capsys, ["sample", "--checkpoint", str(fifo)], "is a named pipe, not a checkpoint")
    says(capsys, ["train", "--resume", str(fifo), "--save", str(tmp_path / "r.npz")], "is a named pipe")
    says(capsys, ["train", "--steps", "1", "--corpus", str(fifo)], "is a named pipe: pass a text file")
    monkeypatch.chdir(tmp_path)  # named relative to here, the pipe was said to be "through a link"
    says(capsys, ["train", "--steps", "1", "--save", "fifo"], "'fifo' is a named pipe, not a regular file; ")
    if os.path.exists("/dev/zero"):
        says(capsys, ["sample", "--checkpoint", "/dev/zero"], "is a character device, not a checkpoint")


def test_json_nested_too_deep_is_a_damaged_file(capsys, tmp_path, text):
    """json.loads raises RecursionError past ~1,000 levels: a merges file or a checkpoint's meta
    of 100,000 '[' was a traceback."""
    deep = "[" * 100_000
    merges = tmp_path / "deep.json"
    merges.write_text(deep)
    says(capsys, ["train", "--steps", "1", "--corpus", str(text), "--tokens", "bpe", "--vocab", "300",
                  "--merges", str(merges)], "cannot be read (it is not JSON)")
    checkpoint = tmp_path / "deep.npz"
    with zipfile.ZipFile(checkpoint, "w") as archive:
        with archive.open("meta.npy", "w") as member:
            np.lib.format.write_array(member, np.array(deep))
    says(capsys, ["sample", "--checkpoint", str(checkpoint)], "cannot be read as a smallem checkpoint")


def test_a_digit_that_int_refuses_is_a_bad_thread_count(capsys, monkeypatch):
    """"²".isdigit() is True, and int("²") a ValueError."""
    monkeypatch.setenv("SMALLEM_THREADS", "²")
    says(capsys, ["train", "--steps", "1"], "SMALLEM_THREADS='²': give a whole number of threads")


def test_a_sample_of_years_is_refused_before_the_model_loads(capsys, tmp_path):
    """`--bytes 1000000000000` ran silently (about a thousand bytes a second, printed at the end)."""
    says(capsys, ["sample", "--checkpoint", str(tmp_path / "none.npz"), "--bytes", "1000000000000"],
         "--bytes 1,000,000,000,000: give at most 1,000,000")


def test_an_empty_value_is_refused_not_taken_for_the_current_folder_or_the_default(capsys, tmp_path,
                                                                                  monkeypatch):
    """`--corpus ''` trained on the current folder, `notebooks ''` copied the notebooks into it,
    `bench --precision ''` ran the whole default benchmark."""
    monkeypatch.chdir(tmp_path)
    says(capsys, ["train", "--steps", "1", "--corpus", ""], "the corpus path is empty")
    says(capsys, ["notebooks", ""], "the folder name is empty")
    assert list(tmp_path.iterdir()) == []
    says(capsys, ["bench", "--precision", ""], "--precision '': give a comma-separated list of")


def test_the_merges_file_and_the_json_file_stay_distinct(capsys, tmp_path, text):
    """--merges is an input (or where learnt merges go): --json there would replace it."""
    merges = tmp_path / "m.json"
    merges.write_text(json.dumps({"format": "x"}))
    says(capsys, ["train", "--steps", "1", "--corpus", str(text), "--tokens", "bpe", "--merges", str(merges),
                  "--json", str(merges)], "is the file given to --merges")


def test_a_vocabulary_past_16_bits_is_refused_before_merges_are_learnt(capsys, text, tmp_path, monkeypatch):
    """`--vocab 70000` learnt 69,743 merges (4.5 s) and cached them before tokenize() refused it."""
    monkeypatch.setenv("SMALLEM_CACHE", str(tmp_path))
    says(capsys, ["train", "--steps", "1", "--corpus", str(text), "--tokens", "bpe", "--vocab", "70000"],
         "--vocab 70000 does not fit the corpus's 16-bit token streams: ask for 65,536 or fewer")
    assert list(tmp_path.iterdir()) == []  # nothing learnt, nothing cached

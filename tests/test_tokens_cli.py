"""Tokens on the command line: `smallem train --tokens bpe` learns (or reads) merges, trains on
their ids from an initial loss of ln V, scores bits per byte, saves the merges in the checkpoint
and checks them when it is sampled or resumed; `smallem checks --tokens bpe` knows V. Bad input
is one line."""

import json
import math

import pytest
from cli_run import one_line_error, run

from smallem import tokens as T
from smallem.data import load_corpus
from smallem.training.checkpoint import load_checkpoint, save_checkpoint
from smallem.training.checks import check_initial_loss
from smallem.training.config import TrainConfig, build_model, config_from
from smallem.training.tokenized import prepare

SMALL = ["--backend", "cpu", "--model", "transformer", "--width", 16, "--heads", 2, "--context", 16,
         "--batch", 8, "--log-every", 5, "--eval-every", 10]


def test_train_on_tokens_save_sample_resume(capsys, tmp_path, corpus):
    ckpt, report = tmp_path / "t.npz", tmp_path / "t.json"
    code, out, _ = run(capsys, "train", *SMALL, "--steps", 10, "--corpus", corpus,
                       "--tokens", "bpe", "--vocab", 290, "--save", ckpt, "--json", report)
    assert code == 0 and "learnt 33 merges" in out and "bits per byte" in out and "sample:" in out
    data = json.loads(report.read_text())
    assert data["config"]["tokens"] == "bpe" and data["config"]["sizes"]["vocab"] == 290
    assert abs(data["initial_loss"] - math.log(290)) < 0.1  # ln V: the checks' first number
    score = data["bits_per_byte"]
    assert score["targets"] < score["bytes"] and 0 < score["bits_per_byte"] < math.log2(290)
    saved = load_checkpoint(ckpt)
    assert len(saved.meta["merges"]) == 33
    assert [tuple(m) for m in saved.meta["merges"]] == T.load_merges(
        next((tmp_path / "cache" / "merges").iterdir()))  # the cached merges, the same
    code, out, _ = run(capsys, "sample", "--checkpoint", ckpt, "--prompt", "def ", "--bytes", 40)
    assert code == 0 and out.startswith("def ") and len(out.encode()) >= 44
    code, out, _ = run(capsys, "train", "--resume", ckpt, "--steps", 15, "--json", report)
    assert code == 0 and json.loads(report.read_text())["steps"] == 15
    assert "learnt" not in out  # the checkpoint's merges, not learnt again


def test_a_merges_file_is_used_and_must_fit_the_vocabulary(capsys, tmp_path, corpus):
    merges = T.save_merges(tmp_path / "m.json", [(100, 101), (257, 102)])
    report = tmp_path / "r.json"
    code, out, _ = run(capsys, "train", *SMALL, "--steps", 5, "--corpus", corpus, "--tokens", "bpe",
                       "--vocab", 259, "--merges", merges, "--json", report)
    assert code == 0 and "learnt" not in out
    assert not (tmp_path / "cache").exists()
    code, _, err = run(capsys, "train", *SMALL, "--steps", 5, "--corpus", corpus, "--tokens", "bpe",
                       "--vocab", 300, "--merges", merges)
    assert code == 2 and one_line_error(err) and "holds 2 merges, a vocabulary of 259" in err
    # --vocab left out: the file's vocabulary, not the default 2,048 refused
    code, out, err = run(capsys, "train", *SMALL, "--steps", 5, "--corpus", corpus, "--tokens", "bpe",
                         "--merges", merges, "--json", report)
    assert code == 0, err
    assert json.loads(report.read_text())["config"]["sizes"]["vocab"] == 259


def test_merges_that_are_no_regular_file_are_refused_before_reading(capsys, tmp_path, corpus):
    import os

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)  # a read would wait forever
    for path, kind in [(pipe, "a named pipe"), ("/dev/zero", "a character device"),
                       (tmp_path, "a folder")]:
        code, _, err = run(capsys, "train", *SMALL, "--steps", 2, "--corpus", corpus, "--tokens",
                           "bpe", "--merges", path)
        assert code == 2 and one_line_error(err) and f"is {kind}, not a regular file" in err, err
        assert "memory" not in err


def test_resuming_a_token_run_on_bytes_says_what_was_typed(capsys, tmp_path, corpus):
    ckpt = tmp_path / "t.npz"
    assert run(capsys, "train", *SMALL, "--steps", 4, "--corpus", corpus, "--tokens", "bpe",
               "--vocab", 270, "--save", ckpt)[0] == 0
    code, _, err = run(capsys, "train", "--resume", ckpt, "--steps", 6, "--tokens", "bytes")
    assert code == 2 and one_line_error(err) and "--tokens bytes" in err and "bpe" in err, err
    assert "--vocab" not in err  # nobody typed it


def test_a_cache_that_is_a_file_is_not_said_to_hold_the_merges(capsys, tmp_path, corpus, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("SMALLEM_CACHE", str(blocker))
    code, out, err = run(capsys, "train", *SMALL, "--steps", 2, "--corpus", corpus, "--tokens", "bpe",
                         "--vocab", 270)
    assert code == 0, err
    line = next(a for a in out.splitlines() if "learnt 13 merges" in a)
    assert "cached in" not in line and "not cached" in line and str(blocker) in line, line


def test_resuming_with_other_merges_is_refused(capsys, tmp_path, corpus):
    ckpt = tmp_path / "t.npz"
    assert run(capsys, "train", *SMALL, "--steps", 5, "--corpus", corpus, "--tokens", "bpe",
               "--vocab", 259, "--save", ckpt)[0] == 0
    other = T.save_merges(tmp_path / "other.json", [(120, 121), (122, 123)])
    code, _, err = run(capsys, "train", "--resume", ckpt, "--steps", 8, "--merges", other)
    assert code == 2 and one_line_error(err) and "not those checkpoint" in err


def test_a_checkpoint_whose_merges_do_not_fit_its_model_is_one_sentence(capsys, tmp_path, corpus):
    ckpt = tmp_path / "t.npz"
    assert run(capsys, "train", *SMALL, "--steps", 5, "--corpus", corpus, "--tokens", "bpe",
               "--vocab", 260, "--save", ckpt)[0] == 0
    saved = load_checkpoint(ckpt)
    model = build_model(config_from(saved.config), "cpu")
    for name, p in model.named_parameters():
        p.assign(saved.parameters[name], name)
    for meta, words in [({**saved.meta, "merges": saved.meta["merges"][:-1]}, "holds 2 merges"),
                        ({**saved.meta, "merges": [[97, 256]] * 3}, "merge 0 joins 256"),
                        ({k: v for k, v in saved.meta.items() if k != "merges"}, "holds no merges")]:
        save_checkpoint(tmp_path / "bad.npz", model, None, meta)
        code, _, err = run(capsys, "sample", "--checkpoint", tmp_path / "bad.npz")
        assert code == 2 and one_line_error(err) and words in err, err


@pytest.mark.parametrize("argv, message", [
    (["--vocab", 300], "--vocab applies to --tokens bpe only"),
    (["--merges", "m.json"], "--merges applies to --tokens bpe only"),
    (["--tokens", "bpe", "--vocab", 200], "leaves no room for a merge"),
    (["--tokens", "words"], "unknown tokens 'words'"),
    (["--tokens", "bpe", "--vocab", 5000], "runs out of pairs to merge"),
    (["--tokens", "bpe", "--merges", "nope.json"], "does not exist"),
])
def test_bad_token_options_are_one_line(capsys, corpus, argv, message):
    code, _, err = run(capsys, "train", *SMALL, "--steps", 2, "--corpus", corpus, *argv)
    assert code == 2 and one_line_error(err) and message in err, err


def test_the_initial_loss_check_knows_the_vocabulary(corpus):
    config = TrainConfig(model="transformer", tokens="bpe", vocab=290,
                         sizes={"width": 16, "heads": 2, "context": 16})
    tokens = prepare(config, load_corpus(corpus))
    result = check_initial_loss("cpu", corpus=tokens, config=config.sizes, batch=16)
    assert result.passed and result.expected.startswith(f"ln 290 = {math.log(290):.4f}")
    assert tokens.train.max() >= 257  # it read ids, not bytes


def test_checks_refuse_a_vocabulary_without_tokens(capsys, corpus):
    code, _, err = run(capsys, "checks", "--model", "transformer", "--corpus", corpus, "--vocab", 300)
    assert code == 2 and one_line_error(err) and "--vocab applies to --tokens bpe only" in err


def test_a_token_models_sample_writes_control_bytes_as_escapes(capsys, tmp_path, corpus):
    ckpt = tmp_path / "t.npz"
    assert run(capsys, "train", *SMALL, "--steps", 2, "--corpus", corpus, "--tokens", "bpe",
               "--vocab", 270, "--save", ckpt)[0] == 0
    # a tiny model after two steps draws nearly any id at temperature 3: control bytes among them
    code, out, _ = run(capsys, "sample", "--checkpoint", ckpt, "--bytes", 3000, "--temperature", 3)
    assert code == 0
    controls = [c for c in out if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0]
    assert controls == [], controls[:5]
    assert "\\x1b" in out or "\\x03" in out or "\\x00" in out  # the escapes are there instead

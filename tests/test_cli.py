"""The command line: train, sample and checks end to end on a small corpus, and bad input as
one line on stderr with exit status 2, never a traceback."""

import json

import numpy as np
import pytest

from smallem.cli import main


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "value", "import", "class", "for", "in", "(x):", "\n"]
    for k in range(12):
        (folder / f"doc{k:02d}.py").write_text(" ".join(rng.choice(words, 300)))
    return folder


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err):
    lines = err.strip().splitlines()
    return len(lines) == 1 and "Traceback" not in err and lines[0].startswith("smallem ")


def test_train_save_json_sample_resume(capsys, tmp_path, corpus):
    ckpt, report = tmp_path / "m.ckpt.npz", tmp_path / "m.json"
    code, out, _ = run(capsys, "train", "--backend", "cpu", "--steps", 10, "--batch", 16,
                       "--corpus", corpus, "--log-every", 5, "--eval-every", 10,
                       "--save", ckpt, "--json", report)
    assert code == 0 and "held-out loss" in out and "bigram" in out and "sample:" in out
    data = json.loads(report.read_text())
    assert data["steps"] == 10 and data["backend"] == "cpu" and data["config"]["batch"] == 16
    assert [(r["step"], r["held_out_loss"] is None) for r in data["history"]] == \
        [(0, False), (5, True), (10, False)]
    assert data["bigram_held_out_loss"] > 0 and data["initial_loss"] > 5

    code, out, _ = run(capsys, "sample", "--checkpoint", ckpt, "--prompt", "def ",
                       "--bytes", 30, "--temperature", 0.5)
    assert code == 0 and out.startswith("def ")

    code, out, _ = run(capsys, "train", "--resume", ckpt, "--steps", 15, "--json", report)
    data = json.loads(report.read_text())
    assert code == 0 and data["steps"] == 15 and data["config"]["batch"] == 16
    assert [r["step"] for r in data["history"]] == [0, 5, 10, 15]


@pytest.mark.parametrize("argv, message", [
    (["train", "--steps", "0"], "steps must be"),
    (["train", "--lr", "-1"], "learning rate"),
    (["train", "--backend", "tpu"], "unknown backend 'tpu'"),
    (["train", "--model", "gpt"], "unknown model"),
    (["train", "--corpus", "/no/such/corpus"], "does not exist"),
    (["train", "--resume", "/no/such.ckpt.npz"], "does not exist"),
    (["sample", "--checkpoint", "/no/such.ckpt.npz"], "does not exist"),
    (["checks", "--backend", "tpu"], "unknown backend"),
    (["train", "--json", "/no/such/folder/r.json"], "does not exist; create it first"),
    (["train", "--seed", "-1"], "the seed must be a whole number, 0 or more"),
    (["train", "--clip", "0"], "the clipping norm must be a positive number"),
    (["train", "--save", "/tmp"], "that is a folder; name a file in it"),
    (["bench", "--block", "0"], "--block at least 1"),
    (["bench", "--steps", "10", "--block", "50"], "must be at least --block"),
    (["bench", "--json", "/no/such/folder/b.json"], "does not exist; create it first"),
    (["figures", "--backend", "tpu"], "unknown backend 'tpu'"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err and one_line_error(err), err


def test_resume_with_a_different_setting_is_refused(capsys, tmp_path, corpus):
    ckpt = tmp_path / "m.ckpt.npz"
    run(capsys, "train", "--backend", "cpu", "--steps", 5, "--batch", 8, "--corpus", corpus,
        "--save", ckpt)
    code, _, err = run(capsys, "train", "--resume", ckpt, "--batch", 32)
    assert code == 2 and "batch is 32 but the checkpoint was trained with 8" in err
    code, _, err = run(capsys, "sample", "--checkpoint", ckpt, "--bytes", -3)
    assert code == 2 and one_line_error(err)


def test_a_damaged_checkpoint(capsys, tmp_path):
    bad = tmp_path / "bad.ckpt.npz"
    bad.write_bytes(b"\x00" * 100)
    code, _, err = run(capsys, "sample", "--checkpoint", bad)
    assert code == 2 and "cannot be read" in err and one_line_error(err)


def test_checks_command(capsys, corpus):
    code, out, _ = run(capsys, "checks", "--backend", "cpu", "--corpus", corpus)
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 3
    assert lines[0].startswith("PASS") and "initial loss" in lines[0]
    assert lines[1].startswith("PASS") and "overfit" in lines[1]
    assert lines[2].split()[0] in ("SKIP", "PASS") and "gpu" in lines[2]

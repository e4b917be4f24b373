"""The command line: train, sample and checks end to end on a small corpus, and bad input as
one line on stderr with exit status 2, never a traceback."""

import importlib.util
import json

import numpy as np
import pytest
from cli_run import one_line_error, run

from smallem.tools.cli import main


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
    (["train", "--save", "/tmp"], "is a folder: name a file in it"),
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
    code, out, err = run(capsys, "checks", "--backend", "cpu", "--corpus", corpus)
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 3
    # a line as each check starts (a CPU's Transformer checks take minutes), on stderr
    assert [line.split(": ")[1].split(" (")[0] for line in err.strip().splitlines()] == \
        ["initial loss", "overfit one batch", "cpu vs gpu loss"], err
    assert lines[0].startswith("PASS") and "initial loss" in lines[0]
    assert lines[1].startswith("PASS") and "overfit" in lines[1]
    assert lines[2].split()[0] in ("SKIP", "PASS") and "gpu" in lines[2]


# files and runs (issue 12, items 8-13) ------------------------------------------------------
SMALL_RUN = ["train", "--backend", "cpu", "--steps", 10, "--batch", 8, "--log-every", 5,
             "--eval-every", 10]


def test_an_output_that_cannot_be_written_is_refused_before_training(capsys, tmp_path, corpus):
    for save, message in (("/proc/run.npz", "cannot create files in folder '/proc'"),
                          (tmp_path / ("a" * 300 + ".npz"), "the name is too long")):
        code, out, err = run(capsys, *SMALL_RUN, "--corpus", corpus, "--save", save)
        assert code == 2 and message in err and one_line_error(err), err
        assert "held-out loss" not in out  # refused before, not after, the run
    code, _, err = run(capsys, *SMALL_RUN, "--corpus", corpus, "--json", "/dev/null")
    assert code == 2 and "'/dev/null' is a character device" in err and one_line_error(err)


def test_outputs_that_would_replace_each_other_or_the_input_are_refused(capsys, tmp_path,
                                                                         corpus):
    ckpt = tmp_path / "m.npz"
    code, _, err = run(capsys, *SMALL_RUN, "--corpus", corpus, "--save", ckpt, "--json", ckpt)
    assert code == 2 and "--save and --json name the same file" in err and not ckpt.exists()
    run(capsys, *SMALL_RUN, "--corpus", corpus, "--save", ckpt)
    before = ckpt.read_bytes()
    code, _, err = run(capsys, "train", "--resume", ckpt, "--steps", 15, "--json", ckpt)
    assert code == 2 and "is the file given to --resume" in err and one_line_error(err)
    assert ckpt.read_bytes() == before


def test_resume_saves_back_to_the_file_it_resumed(capsys, tmp_path, corpus):
    from smallem.training.checkpoint import load_checkpoint

    ckpt, other = tmp_path / "m.npz", tmp_path / "other.npz"
    run(capsys, *SMALL_RUN, "--corpus", corpus, "--save", ckpt)
    code, out, _ = run(capsys, "train", "--resume", ckpt, "--steps", 15)
    assert code == 0 and "saved to" in out and str(ckpt) in out
    assert load_checkpoint(ckpt).step == 15
    code, _, _ = run(capsys, "train", "--resume", ckpt, "--steps", 20, "--save", other)
    assert code == 0 and load_checkpoint(ckpt).step == 15 and load_checkpoint(other).step == 20


def test_a_save_that_fails_at_the_end_keeps_the_run(capsys, tmp_path, corpus, monkeypatch):
    import smallem.training.checkpoint

    ckpt, report = tmp_path / "m.npz", tmp_path / "m.json"
    real = smallem.training.checkpoint.atomic_write

    def failing(path, write, what="file"):
        if str(path) == str(ckpt):
            raise smallem.SmallemError(f"cannot write checkpoint {str(path)!r}: disk full")
        return real(path, write, what=what)

    monkeypatch.setattr(smallem.training.checkpoint, "atomic_write", failing)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # the rescue goes to the current folder
    code, out, err = run(capsys, *SMALL_RUN, "--corpus", corpus, "--save", ckpt,
                         "--json", report)
    rescued = list((tmp_path / "work").glob("smallem-rescued-*-m.npz"))
    assert len(rescued) == 1 and code == 1, (out, err)
    assert "disk full" in err and f"saved it to {rescued[0]} instead" in err
    assert f"--resume {rescued[0]}" in err
    assert json.loads(report.read_text())["steps"] == 10  # the results are written all the same
    assert smallem.training.checkpoint.load_checkpoint(rescued[0]).step == 10


def test_sgd_with_weight_decay_is_refused(capsys):
    code, _, err = run(capsys, "train", "--optimizer", "sgd", "--weight-decay", "0.5",
                       "--steps", 1, "--corpus", "/no/such/corpus")
    assert code == 2 and "--weight-decay applies to AdamW only" in err and one_line_error(err)


def test_a_batch_too_large_for_memory_is_one_sentence(capsys, corpus):
    code, _, err = run(capsys, "train", "--backend", "cpu", "--steps", 1, "--corpus", corpus,
                       "--batch", 10**12)
    last = err.strip().splitlines()[-1]  # after the progress bar's first frame
    assert code == 2 and "Traceback" not in err, err
    assert last.startswith("smallem train: error: out of memory") and "--batch" in last


def test_figures_where_the_folder_cannot_be_created(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    for out, message in ((tmp_path / "file" / "figs", "is not a folder"),
                         ("/proc/figs", "cannot create folder '/proc/figs'")):
        code, _, err = run(capsys, "figures", "--only", "network_221", "--out", out)
        assert code == 2 and message in err and one_line_error(err), err


def test_a_prompt_that_is_not_utf8_is_fed_as_its_bytes(capsys, tmp_path, corpus):
    ckpt = tmp_path / "m.npz"
    run(capsys, *SMALL_RUN, "--corpus", corpus, "--save", ckpt)
    # what Python makes of `--prompt $'caf\xe9'`: the byte 0xE9 as a lone surrogate
    code, out, err = run(capsys, "sample", "--checkpoint", ckpt, "--prompt", "caf\udce9",
                         "--bytes", 5)
    assert code == 0 and out.startswith("caf\ufffd"), err


def test_a_checkpoint_with_nan_weights_cannot_be_sampled(capsys, tmp_path, corpus):
    ckpt = tmp_path / "m.npz"
    run(capsys, *SMALL_RUN, "--corpus", corpus, "--save", ckpt)
    with np.load(ckpt, allow_pickle=False) as archive:
        content = {k: archive[k] for k in archive.files}
    content["param/hidden.weight"] = np.full_like(content["param/hidden.weight"], np.nan)
    np.savez(ckpt, **content)
    code, _, err = run(capsys, "sample", "--checkpoint", ckpt)
    assert code == 2 and "'hidden.weight' holds NaN" in err and one_line_error(err), err


def test_a_run_that_diverges_warns_and_still_writes_its_results(capsys, tmp_path, corpus):
    report, ckpt = tmp_path / "r.json", tmp_path / "m.npz"
    code, out, err = run(capsys, "train", "--backend", "cpu", "--steps", 40, "--batch", 8,
                         "--corpus", corpus, "--optimizer", "sgd", "--lr", 1e30,
                         "--log-every", 5, "--eval-every", 10, "--json", report, "--save", ckpt)
    assert code == 1 and "Traceback" not in err and "RuntimeWarning" not in err, err
    assert "diverged" in err and "lower --lr" in err, err
    data = json.loads(report.read_text())
    assert data["diverged_at"] is not None and data["steps"] <= 40
    assert not ckpt.exists()  # NaN weights are not saved over anything


def test_sigterm_stops_between_steps_and_saves(tmp_path, corpus):
    import os
    import signal
    import subprocess
    import sys

    from smallem.training.checkpoint import load_checkpoint

    ckpt = tmp_path / "m.npz"
    child = subprocess.Popen(
        [sys.executable, "-u", "-m", "smallem", "train", "--backend", "cpu", "--steps",
         "100000", "--batch", "8", "--corpus", str(corpus), "--log-every", "1",
         "--eval-every", "100000", "--save", str(ckpt)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in child.stdout:
            if line.startswith("step"):
                break
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
    assert child.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err and f"--resume {ckpt}" in err, err
    assert (out + err).count("stopped by SIGTERM") == 1, (out, err)  # said once, on stderr
    assert 0 < load_checkpoint(ckpt).step < 100000


# issue 22: the command as a new user meets it ---------------------------------------------------
def test_version_and_a_top_level_help_that_says_what_smallem_is(capsys):
    import smallem

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"smallem {smallem.__version__}\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "teaches backpropagation by building it" in out
    examples = out.split("examples:\n")[1].splitlines()
    assert sum(line.startswith("  smallem ") for line in examples) == 3


def test_train_help_lists_the_choices_and_no_option_that_does_not_exist(capsys):
    from smallem.backends import BACKEND_NAMES
    from smallem.optim import OPTIMIZERS
    from smallem.training import registry
    from smallem.training.config import TrainConfig

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for names in (registry.names(), OPTIMIZERS, BACKEND_NAMES):
        assert "{" + ",".join(names) + "}" in out
    assert "save_every" not in out and f"every {TrainConfig().save_every:,} steps" in out


def test_an_option_is_named_as_typed(capsys):
    code, _, err = run(capsys, "train", "--log-every", 0)
    assert code == 2 and "--log-every must be a whole number, 1 or more, got 0" in err
    code, _, err = run(capsys, "train", "--eval-every", -1)
    assert code == 2 and "--eval-every must be" in err and one_line_error(err)


def test_a_redirected_log_gets_log_lines_not_a_progress_bar(capsys, corpus):
    """117 KB of carriage-return updates for a 2,000-step run went into a log file before."""
    code, out, err = run(capsys, "train", "--backend", "cpu", "--steps", 30, "--batch", 8,
                         "--corpus", corpus, "--log-every", 10, "--eval-every", 30)
    assert code == 0 and "\r" not in err and "step/s]" not in err
    assert [line.split()[1] for line in out.splitlines() if line.startswith("step")] == \
        ["10/30", "20/30", "30/30"]


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="PyTorch is installed")
def test_bench_says_why_the_pytorch_columns_are_empty(capsys, corpus):
    code, out, _ = run(capsys, "bench", "--steps", 2, "--warmup", 1, "--block", 1, "--no-cpu64",
                       "--corpus", corpus)
    assert code == 0 and "PyTorch is not installed here" in out


def test_figures_says_what_it_is_doing(capsys, tmp_path, corpus):
    code, out, _ = run(capsys, "figures", "--only", "mlp_vs_bigram", "--steps", 2, "--batch", 4,
                       "--corpus", corpus, "--out", tmp_path)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("training the mlp with adamw for the figures: 2 steps")
    assert lines[1].startswith("training the bigram") and lines[2].startswith("wrote ")


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_the_cupy_sentence_is_right_for_a_wheel_install(capsys):
    code, _, err = run(capsys, "train", "--backend", "gpu")
    assert code == 2 and one_line_error(err)
    assert "pip install cupy-cuda12x" in err and "cupy-cuda13x" in err and "-e" not in err


def test_the_readme_python_blocks_run_as_written():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) >= 2
    namespace = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - README's own code
    assert namespace["grads"][namespace["a"]] == -1.5


def test_an_fp16_run_diverging_from_weights_past_its_range_names_them_not_the_lr(capsys, tmp_path, corpus):
    ckpt = tmp_path / "m.npz"
    assert run(capsys, "train", "--backend", "cpu", "--steps", 2, "--batch", 8, "--corpus", corpus,
               "--precision", "fp16", "--log-every", 1, "--eval-every", 2, "--save", ckpt)[0] == 0
    with np.load(ckpt, allow_pickle=False) as archive:
        content = {k: archive[k] for k in archive.files}
    content["param/hidden.weight"] = content["param/hidden.weight"] * 0 + 1e5  # past 65,504
    np.savez(ckpt, **content)
    code, _, err = run(capsys, "train", "--resume", ckpt, "--steps", 4)
    assert code == 1 and "diverged" in err and "Traceback" not in err, err
    assert "hidden.weight reaches 100,000, past fp16's largest number 65,504" in err, err
    assert "--lr" not in err, err

"""Data parallel (smallem/ranks, training/ranked.py): N ranks, or K micro-batches, follow one
process on the whole batch to float64 rounding (cpu64), a batch that does not divide included;
a stop on one rank stops all after the same step and its checkpoint resumes with another N; a
killed rank stops the others with one sentence; mismatched ranks and a missing mpi4py are one
sentence each. Real ranks are started by mpiexec (MPICH's wheel), a few small runs."""

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from smallem import SmallemError
from smallem.data import load_corpus
from smallem.optim import SGD
from smallem.ranks import Solo, gather_bytes, launch, ring_bytes, rows
from smallem.ranks.launch import cores, launch_command, oversubscribed
from smallem.training.checkpoint import load_checkpoint
from smallem.training.config import build_model
from smallem.training.loop import train
from smallem.training.ranked import RankedStep
from smallem.training.step import loss_and_gradients

sys.path.insert(0, str(Path(__file__).parent))
import ranked_runs as runs  # noqa: E402 - the functions the ranks run, by name

TESTS = Path(__file__).parent
ROUNDING = 1e-12  # relative: float64's, a few hundred operations deep


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_bytes=runs.CORPUS_BYTES)


@pytest.fixture(scope="module")
def one_process(corpus):
    """The reference: one process on the whole batch of 7, 100 steps."""
    return runs.outcome(train(runs.tiny(), corpus=corpus, progress=False, log=None))


@pytest.fixture
def ranks_can_import_the_tests(monkeypatch):
    pytest.importorskip("mpi4py")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(TESTS), str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))


def assert_same(run, reference, history=True):
    for name, value in reference["parameters"].items():
        scale = np.abs(value).max()
        assert np.abs(run["parameters"][name] - value).max() <= ROUNDING * scale, name
    assert run["held_out"][-1] == pytest.approx(reference["held_out"][-1], rel=ROUNDING)
    if not history:
        return
    np.testing.assert_allclose([x for x in run["losses"] if x is not None],
                               [x for x in reference["losses"] if x is not None], rtol=ROUNDING)
    np.testing.assert_allclose([x for x in run["held_out"] if x is not None],
                               [x for x in reference["held_out"] if x is not None], rtol=ROUNDING)


def test_rows_share_a_batch_the_first_ranks_one_more():
    assert [rows(10, 3, r) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [rows(7, 2, r) for r in range(2)] == [(0, 4), (4, 7)]
    assert rows(8, 1, 0) == (0, 8)
    with pytest.raises(SmallemError, match="4 ranks cannot share a batch of 3"):
        rows(3, 4, 0)


def test_a_ring_sends_two_n_minus_one_over_n_the_gather_n_minus_one():
    assert ring_bytes(1000, 4) == 1500 and ring_bytes(1000, 1) == 0
    assert gather_bytes(1000, 4) == 3000


def test_micro_batches_sum_to_the_whole_batch_gradient(corpus):
    """One SGD step at lr 1 moves each parameter by minus its gradient: accumulated over 3
    micro-batches of 4, 3, 3 rows, it is the gradient of the mean over all 10."""
    config = runs.tiny()
    contexts = np.random.default_rng(1).integers(0, 257, (10, 4))
    targets = np.random.default_rng(2).integers(0, 257, 10)
    model = build_model(config, "cpu64")
    _, grads = loss_and_gradients("cpu64", lambda tape: model.loss(tape, contexts, targets))
    expected = {n: p.grad(grads).copy() for n, p in model.named_parameters()}
    before = {n: p.value.copy() for n, p in model.named_parameters()}
    step = RankedStep(model_backend := model.named_parameters()[0][1].backend, model, SGD(1.0),
                      Solo(), accumulate=3)
    assert step.pieces(10) == [(0, 4), (4, 7), (7, 10)]
    step(contexts, targets)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(before[name] - p.value, expected[name], rtol=ROUNDING,
                                   atol=ROUNDING * np.abs(expected[name]).max())
    assert model_backend.name == "cpu64"
    with pytest.raises(SmallemError, match="--accumulate 11 splits"):
        RankedStep(model_backend, model, SGD(1.0), Solo(), accumulate=11)(contexts, targets)


def test_accumulating_follows_one_process_for_100_steps(corpus, one_process):
    assert_same(runs.outcome(train(runs.tiny(accumulate=3), corpus=corpus, progress=False,
                                   log=None)), one_process)


def test_one_two_and_three_ranks_follow_one_process(one_process, ranks_can_import_the_tests):
    """Batch 7: 4 + 3 rows on two ranks, 3 + 2 + 2 on three; the sum weighted by rows."""
    from smallem import ranks

    outcomes = ranks.run(3, "ranked_runs:trajectories", [1, 2, 3], {})[0]
    for n in (1, 2, 3):
        assert_same(outcomes[n], one_process)
        assert outcomes[n]["bits_per_byte"] == pytest.approx(one_process["bits_per_byte"])


def test_a_signal_on_one_rank_stops_both_and_resumes_on_one(tmp_path, corpus, one_process,
                                                            ranks_can_import_the_tests):
    """SIGTERM on rank 1 at step 10's log point: step 11 carries it in its sum, both stop after
    it, rank 0 saves; one process resumes that checkpoint to step 100 and ends where the
    uninterrupted run did (its history has the first leg's log points, 5 steps apart)."""
    from smallem import ranks

    save = tmp_path / "run.npz"
    said = ranks.run(2, "ranked_runs:stopped_by_a_signal", signal.SIGTERM, 10, str(save))
    assert said[0].startswith("stopped by SIGTERM at step 11: checkpoint saved to"), said
    assert said[1].startswith("stopped by SIGTERM at step 11"), said
    assert load_checkpoint(save).step == 11
    resumed = train(runs.tiny(), corpus=corpus, progress=False, log=None, resume=save)
    assert_same(runs.outcome(resumed), one_process, history=False)


def test_a_killed_rank_stops_the_other_with_one_sentence(tmp_path, corpus, capfd,
                                                         ranks_can_import_the_tests):
    """Rank 1 is killed (SIGKILL) at step 40 of a run that saves every 5 steps: mpiexec stops
    rank 0, the launcher says so in one sentence, and the last checkpoint is whole."""
    from smallem import ranks

    save = tmp_path / "run.npz"
    train(runs.tiny(steps=5, save_every=5), corpus=corpus, progress=False, log=None, save=save)
    with pytest.raises(SmallemError, match="returned nothing"):
        ranks.run(2, "ranked_runs:killed", 40, str(save), timeout=300)
    err = capfd.readouterr().err
    assert "a rank of 2 ended running ranked_runs:killed (Killed (signal 9))" in err, err
    assert "mpiexec stopped the others" in err and "BAD TERMINATION" not in err
    checkpoint = load_checkpoint(save)
    assert checkpoint.step % 5 == 0 and 5 < checkpoint.step <= 40
    train(runs.tiny(steps=checkpoint.step + 1), corpus=corpus, progress=False, log=None,
          resume=save)  # it resumes


def test_ranks_started_differently_are_refused_naming_the_field(ranks_can_import_the_tests):
    from smallem import ranks

    seeds, corpora, count, empty = ranks.run(2, "ranked_runs:refusals")[0]
    assert seeds.startswith("rank 1 was started with seed 1 and rank 0 with 0: start every "
                            "rank with the same command line and corpus"), seeds
    assert corpora.startswith("rank 1 was started with the corpus's documents"), corpora
    assert count == ("--ranks 3, but mpiexec started 2 processes: make them agree, or drop "
                     "--ranks under mpiexec")
    assert empty.startswith("--accumulate 2 splits the 1 row a rank reads of the batch of 3")


def test_the_command_line_on_two_ranks_is_the_one_process_run(tmp_path, capfd,
                                                              ranks_can_import_the_tests):
    from smallem.tools.cli import main

    text = tmp_path / "corpus.txt"
    words = np.random.default_rng(0).choice(["def", "return", "self", "(x):", "\n"], 20_000)
    text.write_text(" ".join(words))
    common = ["train", "--backend", "cpu64", "--steps", "12", "--batch", "7", "--log-every", "6",
              "--eval-every", "12", "--corpus", str(text)]
    assert main([*common, "--json", str(tmp_path / "one.json")]) == 0
    assert main([*common, "--ranks", "2", "--accumulate", "2", "--json",
                 str(tmp_path / "two.json")]) == 0
    out = capfd.readouterr().out
    assert out.count("held-out loss") == 2  # rank 0 alone reports
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert (one["ranks"], two["ranks"]) == (1, 2)
    assert two["held_out_loss"] == pytest.approx(one["held_out_loss"], rel=ROUNDING)
    assert two["final_train_loss"] == pytest.approx(one["final_train_loss"], rel=ROUNDING)


def test_ranks_without_mpi4py_say_how_to_install_it(monkeypatch, capsys):
    from smallem.tools.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mpi4py" else real(name, *a))
    assert main(["train", "--ranks", "2", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "mpi4py is not installed: pip install 'smallem[ranks]'" in err and err.count("\n") == 1


def test_more_ranks_than_cores_is_said_and_allowed():
    assert oversubscribed(cores()) is None
    said = oversubscribed(cores() + 1)
    assert said.startswith(f"{cores() + 1} ranks on {cores()} core") and "allowed" in said



@pytest.mark.parametrize("banner, open_mpi", [
    ("mpiexec (OpenRTE) 4.1.6\n\nReport bugs to http://www.open-mpi.org/community/help/\n", True),
    ("mpiexec (Open MPI) 5.0.3\n\nReport bugs to https://www.open-mpi.org/community/help/\n", True),
    ("HYDRA build details:\n    Version:                                 5.0.2\n", False)])
def test_open_mpi_is_told_not_to_bind_each_rank_to_one_core(monkeypatch, banner, open_mpi):
    """Open MPI binds a rank to one core when N <= 2, where its cores/N threads would share
    that core (the 16-core device host: one rank's Transformer step 197 ms); MPICH's hydra
    binds nothing and allows more ranks than cores by itself."""
    monkeypatch.setattr(launch, "_version", lambda launcher: banner)
    for n in (1, 2, cores() + 1):
        command = launch_command("mpiexec", n, ["-m", "smallem", "train"])
        assert command[-6:] == ["-n", str(n), sys.executable, "-m", "smallem", "train"]
        assert command[1:3] == (["--bind-to", "none"] if open_mpi else ["-n", str(n)])
        assert ("--oversubscribe" in command) == (open_mpi and n > cores())

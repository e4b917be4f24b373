"""Held-out evaluation (training/evaluation.py): the periodic evaluations sized to the run (a short
run reads a few batches, a long one all 32), spread over the held-out text, the final one on all
8,192 targets; and a run that says what it evaluates while it does (issue 40)."""

import pytest

from smallem.data import load_corpus
from smallem.models.mlp import MlpConfig
from smallem.training.config import EVAL_BATCHES, TrainConfig, build_model
from smallem.training.evaluation import evaluate, held_out_batches, periodic_batches, spread
from smallem.training.loop import train


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_bytes=200_000)


def test_the_default_runs_evaluate_on_every_batch_a_short_run_on_few():
    for model in ("mlp", "transformer", "bigram"):
        assert periodic_batches(TrainConfig(model=model)) == EVAL_BATCHES
    # issue 40: a 20-step CPU Transformer read 32 batches at step 0, some 30 steps' worth
    assert periodic_batches(TrainConfig(model="transformer", steps=20)) == 1
    assert periodic_batches(TrainConfig(model="transformer", steps=400)) == 30  # 0.3 · 400 · 64 / 256
    assert periodic_batches(TrainConfig(model="transformer", steps=400, eval_every=100)) == 6
    assert periodic_batches(TrainConfig(steps=100, batch=8)) == 1  # never none


def test_spread_takes_batches_over_the_whole_held_out_text():
    assert spread(list(range(32)), 4) == [0, 10, 21, 31]
    assert spread(list(range(3)), 5) == [0, 1, 2]


def test_a_short_run_scores_step_0_on_its_share_and_the_end_on_every_target(corpus):
    config = TrainConfig(backend="cpu64", steps=12, batch=8, log_every=4, eval_every=6,
                         eval_batches=4, save_every=0, sizes=MlpConfig(context=4, embed=3, hidden=8))
    periodic = spread(held_out_batches(config, corpus), periodic_batches(config))
    assert len(periodic) == 1
    result = train(config, corpus=corpus, progress=False, log=None)
    assert result.history[0]["held_out_loss"] == evaluate(build_model(config, "cpu64"), periodic)
    assert result.held_out_loss == evaluate(result.model, held_out_batches(config, corpus))


def test_a_run_shows_what_it_evaluates_before_its_first_step(corpus, capsys):
    config = TrainConfig(backend="cpu", steps=2, batch=8, log_every=2, eval_every=2,
                         eval_batches=2, save_every=0, sizes=MlpConfig(context=4, embed=3, hidden=8))
    train(config, corpus=corpus, progress=True, log=None)
    err = capsys.readouterr().err  # tqdm's bars, each named for what it evaluates
    assert "held-out loss before step 1" in err
    assert "held-out loss, 512 targets" in err and "bits per byte" in err

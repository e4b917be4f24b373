"""One training step, evaluation, sampling, the loop and its history, and exact resume: an
interrupted run continued from its checkpoint gives the losses of an uninterrupted one."""

import os
import signal

import numpy as np
import pytest

from smallem import SmallemError, Tape
from smallem.autodiff.tape import Gradients
from smallem.data import load_corpus
from smallem.models.bigram import Bigram, bigram_log_probs
from smallem.models.mlp import Mlp, MlpConfig
from smallem.optim import AdamW
from smallem.training.config import TrainConfig
from smallem.training.generate import load_model, sample
from smallem.training.loop import evaluate, train
from smallem.training.step import loss_and_gradients, train_step

SMALL = MlpConfig(context=16, embed=8, hidden=32)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_bytes=300_000)  # the first dozen files of the standard library


def config(**overrides):
    base = dict(backend="cpu", steps=30, batch=32, log_every=10, eval_every=10, eval_batches=2,
                save_every=0, sizes=SMALL)
    return TrainConfig(**{**base, **overrides})


def test_loss_and_gradients_leave_the_loss_unread(backend):
    model = Mlp(SMALL, backend)
    contexts, targets = np.zeros((4, 16), np.int64), np.ones(4, np.int64)
    loss, grads = loss_and_gradients(backend, lambda tape: model.loss(tape, contexts, targets))
    assert isinstance(grads, Gradients) and type(loss) is not float  # a backend value
    assert backend.shape(loss) == ()
    assert all(p.grad(grads) is not None for p in model.parameters())


def test_train_step_lowers_the_loss_on_a_fixed_batch(backend):
    model, opt = Mlp(SMALL, backend), AdamW(lr=1e-2)
    rng = np.random.default_rng(0)
    contexts, targets = rng.integers(0, 257, (8, 16)), rng.integers(0, 257, 8)
    losses = [backend.item(train_step(backend, model, opt,
                                      lambda tape: model.loss(tape, contexts, targets)))
              for _ in range(20)]
    assert losses[-1] < losses[0] - 1.0


def test_evaluate_leaves_parameters_free_to_update(corpus):
    model = Mlp(SMALL, "cpu")
    batch = (np.zeros((2, 16), np.int64), np.zeros(2, np.int64))
    value = evaluate(model, [batch, batch])
    tape = Tape("cpu")
    expected = float(model.loss(tape, *batch).value)
    assert value == pytest.approx(expected)
    tape.close()
    loss, grads = loss_and_gradients("cpu", lambda t: model.loss(t, *batch))
    AdamW().step(model.parameters(), grads)  # no open tape left behind by evaluate


def test_bigram_closed_form_is_smoothed_counts():
    tokens = np.array([1, 2, 1, 2, 1, 3])  # pairs: (1,2) twice, (2,1) twice, (1,3) once
    logp = bigram_log_probs(tokens, vocab=4, smoothing=0.5)
    assert np.exp(logp[1, 2]) == pytest.approx((2 + 0.5) / (3 + 4 * 0.5))
    assert np.exp(logp[0, 0]) == pytest.approx(0.25)  # never seen: uniform
    np.testing.assert_allclose(np.exp(logp).sum(axis=1), 1.0)


def test_closed_form_bigram_beats_the_uniform_guess(corpus):
    from smallem.data import fixed_batches

    held = fixed_batches(corpus.held_out, 64, 4)
    assert evaluate(Bigram.fit(corpus.train), held) < evaluate(Bigram(), held) - 2.0


def test_train_returns_a_history(corpus):
    seen = []
    result = train(config(), corpus=corpus, progress=False, log=None, callbacks=[seen.append])
    assert [r["step"] for r in result.history] == [0, 10, 20, 30]
    assert result.history[0]["train_loss"] is None and seen == result.history[1:]
    assert all(r["held_out_loss"] is not None for r in result.history)
    assert result.steps == 30 and result.backend == "cpu"
    assert abs(result.initial_loss - np.log(257)) < 0.05
    assert result.final_train_loss < result.initial_loss
    curves = result.curves()
    assert np.isnan(curves["train_loss"][0]) and curves["step"].tolist() == [0, 10, 20, 30]
    out = result.to_json()
    for key in ("config", "backend", "steps", "wall_seconds", "initial_loss", "final_train_loss",
                "held_out_loss", "bigram_held_out_loss", "history"):
        assert key in out
    assert out["config"]["lr"] == 1e-3 and out["parameters"] == Mlp(SMALL).parameter_count()


def test_bigram_trains_with_the_same_loop(corpus):
    result = train(config(model="bigram", sizes=None, optimizer="sgd", lr=5.0), corpus=corpus,
                   progress=False, log=None)
    assert result.model.parameter_names() == ["table.weight"]
    assert result.held_out_loss < result.history[0]["held_out_loss"] - 0.5


@pytest.mark.parametrize("name", ["cpu64", "cpu"])
def test_resume_gives_bit_identical_losses(corpus, tmp_path, name):
    straight = train(config(backend=name, log_every=1), corpus=corpus, progress=False, log=None)
    path = tmp_path / "half.ckpt.npz"
    train(config(backend=name, log_every=1, steps=15), corpus=corpus, save=path,
          progress=False, log=None)
    resumed = train(config(backend=name, log_every=1), corpus=corpus, resume=path,
                    progress=False, log=None)
    # Every step's train loss, bit for bit. The 15-step run also evaluated at its last step,
    # so its history holds one held-out loss more; the others must match.
    assert [(r["step"], r["train_loss"]) for r in resumed.history] == \
        [(r["step"], r["train_loss"]) for r in straight.history]
    held = {r["step"]: r["held_out_loss"] for r in straight.history}
    assert all(r["held_out_loss"] == held[r["step"]] for r in resumed.history
               if held[r["step"]] is not None)
    for (n, p), (_, q) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=n)


def test_ctrl_c_saves_between_steps_and_resumes_exactly(corpus, tmp_path):
    """A real SIGINT in the middle of the run: the loop finishes the step, saves, and stops."""
    straight = train(config(log_every=5), corpus=corpus, progress=False, log=None)
    path = tmp_path / "stopped.ckpt.npz"

    def interrupt(record):
        if record["step"] == 10:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        train(config(log_every=5), corpus=corpus, save=path, callbacks=[interrupt],
              progress=False, log=None)
    resumed = train(config(log_every=5), corpus=corpus, resume=path, progress=False, log=None)
    assert [r["train_loss"] for r in resumed.history] == [r["train_loss"] for r in straight.history]


def test_resume_refuses_a_different_run(corpus, tmp_path):
    path = tmp_path / "run.ckpt.npz"
    train(config(steps=5), corpus=corpus, save=path, progress=False, log=None)
    with pytest.raises(SmallemError, match="lr is 0.01 but the checkpoint was trained with 0.001"):
        train(config(lr=0.01), corpus=corpus, resume=path, progress=False, log=None)
    with pytest.raises(SmallemError, match="past --steps 3"):
        train(config(steps=3), corpus=corpus, resume=path, progress=False, log=None)
    other = load_corpus(max_bytes=50_000)
    with pytest.raises(SmallemError, match="corpus differs"):
        train(config(), corpus=other, resume=path, progress=False, log=None)


@pytest.mark.parametrize("overrides, message", [
    ({"steps": 0}, "steps must be"), ({"batch": -1}, "batch must be"),
    ({"lr": -1.0}, "learning rate"), ({"lr": float("inf")}, "learning rate"),
    ({"model": "gpt"}, "unknown model"), ({"backend": "tpu"}, "unknown backend"),
    ({"optimizer": "adam"}, "unknown optimizer"), ({"weight_decay": -1.0}, "weight decay"),
    ({"clip": 0.0}, "the clipping norm must be a positive number"),
])
def test_bad_configs_are_one_clear_error(overrides, message, corpus):
    """Each bad value is refused where it is used, before any training: names and counts by
    the config itself, the optimizer's numbers by the optimizer train() builds first."""
    with pytest.raises(SmallemError, match=message):
        train(config(**overrides), corpus=corpus, progress=False, log=None)


def test_sampling(corpus, tmp_path):
    path = tmp_path / "m.ckpt.npz"
    result = train(config(steps=10), corpus=corpus, save=path, progress=False, log=None)
    text = sample(result.model, "def ", 40, temperature=1.0, seed=3)
    assert isinstance(text, str) and text == sample(result.model, "def ", 40, seed=3)
    assert text != sample(result.model, "def ", 40, seed=4)
    greedy = sample(result.model, "import ", 20, temperature=0)
    assert greedy == sample(result.model, "import ", 20, temperature=0, seed=9)
    assert sample(result.model, "x", 0) == ""
    model, checkpoint = load_model(path, "cpu64")
    assert checkpoint.step == 10 and model.parameter_count() == result.model.parameter_count()
    assert sample(model, "def ", 40, seed=3) == text  # float64 picks the same bytes here
    with pytest.raises(SmallemError, match="temperature"):
        sample(model, "", 5, temperature=-1.0)
    with pytest.raises(SmallemError, match="number of bytes"):
        sample(model, "", -5)


def test_default_learning_rate_depends_on_model_and_optimizer():
    from smallem.training import registry

    mlp, bigram = registry.get("mlp").learning_rates, registry.get("bigram").learning_rates
    assert TrainConfig().learning_rate == mlp["adamw"] == 1e-3
    assert TrainConfig(optimizer="sgd").learning_rate == mlp["sgd"] == 0.5
    assert TrainConfig(model="bigram").learning_rate == bigram["adamw"] == 1e-2
    assert TrainConfig(model="bigram", lr=0.5).learning_rate == 0.5
    assert TrainConfig().lr is None  # nothing is filled in behind the user's back


def test_steps_per_second_counts_training_steps_only(corpus, tmp_path, monkeypatch):
    """The rate a run reports leaves out what follows its last step: the final save and a
    Transformer's every-position evaluation (slowed here to 1 s), as it leaves out evaluations."""
    import time

    from smallem.models.transformer import TransformerConfig
    from smallem.training import loop

    real = loop.evaluate

    def evaluate(model, batches, *rest):
        if np.ndim(batches[0][1]) == 2:  # every position's targets: the end-of-run evaluation
            time.sleep(1.0)
        return real(model, batches, *rest)

    monkeypatch.setattr(loop, "evaluate", evaluate)
    sizes = TransformerConfig(layers=1, width=8, heads=2, context=8)
    result = train(config(model="transformer", sizes=sizes, steps=4, batch=2, log_every=2,
                          eval_every=4), corpus=corpus, progress=False, log=None)
    assert result.held_out_every_position is not None
    assert result.steps / result.steps_per_second < result.wall_seconds

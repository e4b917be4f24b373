"""The Transformer and what it stands on: softmax (causal), GELU, sequence data, and the
evaluation on the MLP's own held-out targets."""

import math

import numpy as np
import pytest

from smallem import SmallemError, Tape, softmax
from smallem.data import (
    BatchSampler,
    SequenceSampler,
    fixed_batches,
    held_out_sequences,
    sequences,
)
from smallem.models import Transformer, TransformerConfig

SMALL = TransformerConfig(layers=2, width=16, heads=2, context=8)


# softmax -------------------------------------------------------------------------------------
def test_softmax_rows_sum_to_one_and_survive_huge_logits():
    x = np.array([[1000.0, 1001.0, 999.0], [-5.0, 0.0, 5.0]])
    tape = Tape("cpu64")
    s = tape.value(softmax(tape, tape.leaf(x)))
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(s, e / e.sum(1, keepdims=True), rtol=1e-15)
    assert np.all(np.isfinite(s))


@pytest.mark.parametrize("backend", ["cpu64", "cpu"])
def test_causal_softmax_masked_weights_and_their_gradients_are_exactly_zero(backend):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 5, 5))
    tape = Tape(backend)
    leaf = tape.leaf(x)
    s = softmax(tape, leaf, causal=True)
    weights = tape.value(s)
    upper = np.triu(np.ones((5, 5), bool), k=1)
    assert np.all(weights[..., upper] == 0.0)  # exactly, not nearly
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    assert np.all(weights[..., 0, 0] == 1.0)  # row 0 has one allowed entry: all its weight
    grads = tape.backward(s, grad=rng.normal(size=x.shape))[leaf]
    assert np.all(grads[..., upper] == 0.0)
    assert np.all(grads[..., 0, 0] == 0.0)  # one allowed entry: its weight cannot move
    assert np.all(grads[..., ~upper][..., 1:] != 0.0)  # the allowed entries do learn


def test_causal_softmax_equals_plain_softmax_of_the_allowed_entries():
    x = np.random.default_rng(1).normal(size=(4, 4))
    tape = Tape("cpu64")
    s = tape.value(softmax(tape, tape.leaf(x), causal=True))
    for i in range(4):
        e = np.exp(x[i, :i + 1] - x[i, :i + 1].max())
        np.testing.assert_allclose(s[i, :i + 1], e / e.sum(), rtol=1e-14)


def test_softmax_rule_is_s_times_g_minus_its_weighted_mean():
    rng = np.random.default_rng(2)
    x, g = rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
    tape = Tape("cpu64")
    leaf = tape.leaf(x)
    out = softmax(tape, leaf)
    s = tape.value(out)
    np.testing.assert_allclose(tape.backward(out, grad=g)[leaf],
                               s * (g - (g * s).sum(-1, keepdims=True)), rtol=1e-14)


@pytest.mark.parametrize("shape", [(4, 5), (5,), (2, 3, 4)])
def test_causal_softmax_refuses_scores_that_are_not_square(shape):
    tape = Tape("cpu64")
    with pytest.raises(SmallemError, match=r"last two dimensions must be equal \(T, T\)"):
        softmax(tape, tape.leaf(np.zeros(shape)), causal=True)


def test_gelu_is_the_tanh_approximation():
    x = np.linspace(-6, 6, 49)
    tape = Tape("cpu64")
    got = tape.value(tape.gelu(tape.leaf(x)))
    want = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-300)


def test_linear_on_three_dimensions_matches_its_rows_one_by_one():
    """The (B, T, C) @ (C, N) path runs as one product; its weight gradient sums every row."""
    rng = np.random.default_rng(3)
    x, w, g = rng.normal(size=(3, 4, 5)), rng.normal(size=(5, 2)), rng.normal(size=(3, 4, 2))
    tape = Tape("cpu64")
    xv, wv = tape.leaf(x), tape.leaf(w)
    y = xv @ wv
    np.testing.assert_allclose(tape.value(y), np.einsum("btc,cn->btn", x, w), rtol=1e-14)
    grads = tape.backward(y, grad=g)
    np.testing.assert_allclose(grads[wv], np.einsum("btc,btn->cn", x, g), rtol=1e-13)
    np.testing.assert_allclose(grads[xv], g @ w.T, rtol=1e-13)


# the model -------------------------------------------------------------------------------------
def test_default_size_and_names_match_pytorchs_count_of_the_same_architecture():
    model = Transformer()
    assert model.parameter_count() == 471_041  # PyTorch's count of 2 × 128 × 4, T 64 (issue 20)
    names = model.parameter_names()
    assert names[:2] == ["token.weight", "position.weight"]
    assert names[-4:] == ["final_norm.weight", "final_norm.bias", "head.weight", "head.bias"]
    for name in ("blocks.0.attention_norm.weight", "blocks.0.attention.query.weight",
                 "blocks.0.attention.key.bias", "blocks.0.attention.value.weight",
                 "blocks.0.attention.output.weight", "blocks.1.mlp_norm.bias",
                 "blocks.1.mlp.expand.weight", "blocks.1.mlp.contract.bias"):
        assert name in names
    shapes = dict((n, p.shape) for n, p in model.named_parameters())
    assert shapes["position.weight"] == (64, 128)
    assert shapes["blocks.0.mlp.expand.weight"] == (128, 512)
    assert shapes["head.weight"] == (128, 257)
    decayed = {n for n, p in model.named_parameters() if p.decay}
    assert decayed == {n for n in names if n.endswith(".weight") and "norm" not in n
                       and n not in ("token.weight", "position.weight")}


def test_initial_weights_are_small_and_the_first_loss_is_near_ln_vocab():
    model = Transformer(SMALL, seed=0)
    assert abs(model.named_parameters()[0][1].numpy().std() - 0.02) < 0.002
    rng = np.random.default_rng(0)
    x = rng.integers(0, 257, size=(4, 8))
    tape = Tape("cpu64")
    assert abs(tape.value(model.loss(tape, x, x)) - math.log(257)) < 0.02


def test_shapes_through_the_model():
    model = Transformer(SMALL, backend="cpu")
    x = np.zeros((3, 5), np.int64)  # T below the context is allowed (sampling a short prompt)
    tape = Tape("cpu")
    assert model.logits(tape, x).shape == (3, 5, 257)
    assert model.loss(tape, x, x).shape == ()
    assert model.loss(tape, x, x[:, 0]).shape == ()


@pytest.mark.parametrize("inputs", [np.zeros((2, 9), np.int64), np.zeros(8, np.int64)])
def test_inputs_longer_than_the_context_or_not_two_dimensional_are_refused(inputs):
    with pytest.raises(SmallemError, match="inputs of shape \\(B, T\\) with T from 1 to"):
        Transformer(SMALL).logits(Tape(), inputs)


@pytest.mark.parametrize("bad, match", [(dict(width=30, heads=4), "split evenly into 4 heads"),
                                        (dict(layers=0), "layers must be a whole number")])
def test_a_config_that_cannot_work_is_one_sentence(bad, match):
    with pytest.raises(SmallemError, match=match):
        TransformerConfig(**bad)


def test_causal_the_output_at_t_ignores_every_byte_after_t():
    model = Transformer(SMALL, seed=1)
    rng = np.random.default_rng(4)
    x = rng.integers(0, 257, size=(2, 8))
    tape = Tape("cpu64")
    before = tape.value(model.logits(tape, x))
    for t in range(7):
        changed = x.copy()
        changed[:, t + 1:] = rng.integers(0, 257, size=(2, 7 - t))
        tape = Tape("cpu64")
        after = tape.value(model.logits(tape, changed))
        np.testing.assert_array_equal(after[:, :t + 1], before[:, :t + 1])
        assert not np.allclose(after[:, t + 1:], before[:, t + 1:])  # later ones do change


def test_last_position_loss_is_the_all_positions_logits_read_at_the_end():
    model = Transformer(SMALL, seed=2)
    x = np.random.default_rng(5).integers(0, 257, size=(3, 8))
    y = np.array([5, 200, 256])
    tape = Tape("cpu64")
    logits = tape.value(model.logits(tape, x))[:, -1]
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    tape = Tape("cpu64")
    np.testing.assert_allclose(tape.value(model.loss(tape, x, y)), -logp[range(3), y].mean(),
                               rtol=1e-12)


def test_the_transformer_passes_finite_differences_end_to_end():
    from smallem.autodiff.gradcheck import check_gradients

    config = TransformerConfig(layers=1, width=4, heads=2, context=3, vocab=5)
    model = Transformer(config, seed=3)
    x, y = np.array([[1, 4, 0], [2, 2, 3]]), np.array([[4, 0, 1], [2, 3, 3]])
    names = [n for n, _ in model.named_parameters()]

    def loss(tape, *leaves):
        for (name, p), leaf in zip(model.named_parameters(), leaves):
            tape.bindings[p] = leaf.index  # the model reads these leaves as its parameters
        return model.loss(tape, x, y)

    rng = np.random.default_rng(6)  # weights moved away from their small start
    values = [p.numpy() + 0.5 * rng.normal(size=p.shape) for p in model.parameters()]
    result = check_gradients(loss, values, name="model", weights=np.ones(()))
    assert result.passed, (result.max_error, names)


# sequence data and the evaluation on the MLP's targets -------------------------------------------
def test_sequences_targets_are_the_inputs_moved_by_one():
    tokens = np.arange(100, dtype=np.uint16)
    x, y = sequences(tokens, np.array([10, 50, 99]), 6)
    np.testing.assert_array_equal(x[1], np.arange(44, 50))
    np.testing.assert_array_equal(y[1], np.arange(45, 51))
    assert y[2, -1] == 99 and x.dtype == np.int64


def test_sequences_before_the_stream_start_with_newlines():
    x, y = sequences(np.arange(20, dtype=np.uint16) + 100, np.array([3]), 6)
    np.testing.assert_array_equal(x[0], [10, 10, 10, 100, 101, 102])
    assert y[0, -1] == 103


def test_sequence_sampler_is_seeded_and_resumes_exactly():
    tokens = np.random.default_rng(0).integers(0, 256, size=5000).astype(np.uint16)
    a = SequenceSampler(tokens, 4, 32, seed=[0, 1])
    first = a.next()
    assert first[0].shape == first[1].shape == (4, 32)
    state = a.state()
    after = a.next()
    b = SequenceSampler(tokens, 4, 32, seed=[9, 9])
    b.load_state(state)
    np.testing.assert_array_equal(b.next()[0], after[0])
    # the same positions as BatchSampler's for the same seed: its target is the last target
    mlp = BatchSampler(tokens, 4, 32, seed=[0, 1]).next()
    np.testing.assert_array_equal(mlp[1], first[1][:, -1])


def test_held_out_sequences_score_exactly_the_mlps_targets():
    """The Transformer is scored on the very bytes the MLP is scored on (training/loop.py's
    fixed_batches with the MLP's context), each with the T bytes before it."""
    from smallem.data import load_corpus

    corpus = load_corpus(max_bytes=600_000)
    mlp = fixed_batches(corpus.held_out, 256, 32, 16)
    seq = held_out_sequences(corpus.held_out, 256, 32, 64)
    assert sum(y.size for _, y in seq) == 8192
    for (contexts, targets), (inputs, last) in zip(mlp, seq):
        assert inputs.shape == (256, 64)
        np.testing.assert_array_equal(last, targets)
        np.testing.assert_array_equal(inputs[:, -16:], contexts)  # the MLP's 16 bytes end it
    every = held_out_sequences(corpus.held_out, 256, 32, 64, last_only=False)
    for (inputs, last), (inputs2, all_targets) in zip(seq, every):
        np.testing.assert_array_equal(inputs, inputs2)
        np.testing.assert_array_equal(all_targets[:, -1], last)
        np.testing.assert_array_equal(all_targets[:, :-1], inputs[:, 1:])


# the run: train, resume, sample, the three checks ------------------------------------------------
@pytest.fixture(scope="module")
def corpus():
    from smallem.data import load_corpus

    return load_corpus(max_bytes=300_000)


def run_config(heads=2, **overrides):
    from smallem.training.config import TrainConfig

    base = dict(model="transformer", backend="cpu", steps=12, batch=4, log_every=3, eval_every=6,
                eval_batches=1, save_every=0,
                sizes=TransformerConfig(layers=1, width=16, heads=heads, context=16))
    return TrainConfig(**{**base, **overrides})


def test_transformer_defaults_of_a_run():
    from smallem.training import registry
    from smallem.training.config import TrainConfig, build_model

    config = TrainConfig(model="transformer")
    assert (config.batch, config.steps) == (64, 10_000)
    assert TrainConfig().batch == 256 and TrainConfig().steps == 20_000  # the MLP's own
    assert config.learning_rate == registry.get("transformer").learning_rates["adamw"] == 1e-3
    assert build_model(config, "cpu").parameter_count() == 471_041
    with pytest.raises(SmallemError, match="split evenly into 3 heads"):
        TrainConfig(model="transformer", sizes={"heads": 3})


def test_train_a_transformer_scores_the_mlps_targets(corpus):
    from smallem.data import fixed_batches
    from smallem.training.config import EVAL_BATCH
    from smallem.training.evaluation import evaluate, held_out_batches
    from smallem.training.loop import train

    result = train(run_config(), corpus=corpus, progress=False, log=None)
    assert [r["step"] for r in result.history] == [0, 3, 6, 9, 12]
    assert abs(result.initial_loss - math.log(257)) < 0.05
    assert result.final_train_loss < result.initial_loss
    assert result.model.parameter_names()[0] == "token.weight"
    batches = held_out_batches(result.config, corpus)
    mlp = fixed_batches(corpus.held_out, EVAL_BATCH, 1, 16)
    np.testing.assert_array_equal(batches[0][1], mlp[0][1])  # the MLP's targets
    assert result.held_out_loss == evaluate(result.model, batches)
    every = held_out_batches(result.config, corpus, last_only=False)
    assert result.held_out_every_position == evaluate(result.model, every)
    assert result.to_json()["held_out_every_position"] == result.held_out_every_position


def test_transformer_resume_is_bit_exact_and_samples(corpus, tmp_path):
    from smallem.training.generate import load_model, sample
    from smallem.training.loop import train

    straight = train(run_config(log_every=1), corpus=corpus, progress=False, log=None)
    path = tmp_path / "half.ckpt.npz"
    train(run_config(log_every=1, steps=5), corpus=corpus, save=path, progress=False, log=None)
    resumed = train(run_config(log_every=1), corpus=corpus, resume=path, progress=False, log=None)
    assert [(r["step"], r["train_loss"]) for r in resumed.history] == \
        [(r["step"], r["train_loss"]) for r in straight.history]
    for (n, p), (_, q) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=n)
    with pytest.raises(SmallemError, match="heads is 4 but the checkpoint was trained with 2"):
        train(run_config(heads=4), corpus=corpus, resume=path, progress=False, log=None)
    model, checkpoint = load_model(path, "cpu")
    assert checkpoint.step == 5 and model.config.context == 16
    text = sample(model, "def ", 30, seed=1)
    assert isinstance(text, str) and text == sample(model, "def ", 30, seed=1)


def test_the_three_checks_on_a_small_transformer(corpus):
    from smallem.training.checks import check_backends_agree, check_initial_loss, check_overfit

    config = TransformerConfig(layers=1, width=32, heads=2, context=16)
    initial = check_initial_loss("cpu", corpus=corpus, config=config, batch=16)
    assert initial.passed, initial
    overfit = check_overfit("cpu", corpus=corpus, config=config, batch=16, max_steps=200,
                            lr=3e-3)
    assert overfit.passed, overfit
    same = check_backends_agree("cpu", "cpu64", corpus=corpus, steps=6, every=3, config=config,
                                batch=4, tolerance=1e-4)
    assert same.passed, same


def test_command_line_trains_and_samples_a_transformer(tmp_path, capsys):
    from smallem.tools.cli import main

    corpus_file = tmp_path / "code.py"
    corpus_file.write_text("def add(a, b):\n    return a + b\n" * 200)
    path = tmp_path / "t.ckpt.npz"
    assert main(["train", "--model", "transformer", "--steps", "4", "--batch", "2",
                 "--layers", "1", "--width", "8", "--heads", "2", "--context", "8",
                 "--log-every", "2", "--eval-every", "4", "--backend", "cpu",
                 "--corpus", str(corpus_file), "--save", str(path)]) == 0
    out = capsys.readouterr().out
    assert "held-out loss" in out and path.exists()
    assert main(["sample", "--checkpoint", str(path), "--bytes", "10", "--prompt", "def"]) == 0
    assert capsys.readouterr().out.startswith("def")
    assert main(["train", "--model", "transformer", "--width", "10", "--heads", "4",
                 "--steps", "1"]) == 2
    assert "split evenly into 4 heads" in capsys.readouterr().err


# against PyTorch's autograd, on the same weights and batch ----------------------------------------
def _torch_pair(backend: str, seed: int = 7):
    torch = pytest.importorskip("torch")
    from smallem.tools.bench_reference import TorchTransformer

    config = TransformerConfig(layers=2, width=32, heads=4, context=16)
    model = Transformer(config, backend=backend, seed=seed)
    rng = np.random.default_rng(seed)
    for _, p in model.named_parameters():  # weights away from their start: LayerNorms included
        p.assign(p.numpy() + 0.1 * rng.normal(size=p.shape))
    x = rng.integers(0, 257, size=(3, 16))
    y = rng.integers(0, 257, size=(3, 16))
    dtype = torch.float64 if backend == "cpu64" else torch.float32
    return model, TorchTransformer(model, dtype=dtype), x, y


@pytest.mark.torch
@pytest.mark.parametrize("backend, loss_tol, grad_tol", [("cpu64", 1e-12, 1e-10),
                                                         ("cpu", 1e-5, 1e-4)])
def test_gradients_equal_pytorchs_autograd(backend, loss_tol, grad_tol):
    model, twin, x, y = _torch_pair(backend)
    tape = Tape(backend)
    loss = model.loss(tape, x, y)
    grads = tape.backward(loss)
    want_loss, want = twin.gradients(x, y)
    assert abs(float(tape.value(loss)) - want_loss) <= loss_tol * abs(want_loss)
    largest = max(np.abs(g).max() for g in want.values())
    for name, p in model.named_parameters():
        got = np.asarray(p.grad(grads), np.float64)
        # The key's bias adds q·b to a whole row of scores, which softmax ignores: its true
        # gradient is 0, and both sides hold rounding noise. Each parameter is measured
        # against its own largest gradient, or a thousandth of the model's where that is less.
        scale = max(np.abs(want[name]).max(), 1e-3 * largest)
        assert np.abs(got - want[name]).max() / scale <= grad_tol, name
        if name.endswith("key.bias"):
            assert np.abs(got).max() < 1e-6 * largest


@pytest.mark.torch
def test_the_same_adamw_steps_as_pytorch():
    """Three AdamW steps on the same batches: smallem's float64 step and PyTorch's agree."""
    from smallem.optim import AdamW
    from smallem.training.step import train_step

    model, twin, x, y = _torch_pair("cpu64")
    optimizer = AdamW(lr=1e-3, weight_decay=0.01)
    for _ in range(3):
        ours = float(train_step("cpu64", model, optimizer, lambda t: model.loss(t, x, y)))
        theirs = float(twin.step(x, y))
        assert abs(ours - theirs) < 1e-10
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.numpy(), twin.weights()[name], rtol=0, atol=1e-10,
                                   err_msg=name)

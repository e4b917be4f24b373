"""Training health: every statistic the monitor reports is recomputed here in plain NumPy from
the same tensors (a hand-written forward and backward of the MLP), the observer is called on
the sampled steps only, the JSON lines round-trip, and the live dashboard redraws one display
in place; dead units by the one rule, on hand-made activations."""

import json
import math

import matplotlib

matplotlib.use("Agg")  # headless: tests never open a window

import numpy as np
import pytest

from smallem import Tape
from smallem.course import dashboard
from smallem.errors import SmallemError
from smallem.models.mlp import Mlp, MlpConfig
from smallem.nn import Linear, Module
from smallem.optim import SGD
from smallem.tools.cli import main
from smallem.training.config import TrainConfig, build_model
from smallem.training.health import (
    HealthMonitor,
    activation_stats,
    dead_fraction,
    dead_units,
    load_health,
)
from smallem.training.loop import train
from smallem.training.step import train_step

SMALL = MlpConfig(context=4, embed=3, hidden=16, vocab=11)


def observed_steps(model, optimizer, loss_fn, steps, observer):
    """`steps` calls of train_step, the observer looking at the steps it wants (as train does)."""
    return [float(train_step("cpu64", model, optimizer, loss_fn,
                             observer=observer if observer.wants(step) else None))
            for step in range(1, steps + 1)]


def small_mlp(seed=0):
    """A small MLP with saturated values, four dead units (bias ±30: |tanh| > 0.97 on
    every example) and a few live ones."""
    model = Mlp(SMALL, backend="cpu64", seed=seed)
    rng = np.random.default_rng(seed + 1)
    model.embedding.weight.assign(rng.normal(size=model.embedding.weight.shape))
    model.hidden.weight.assign(rng.normal(size=model.hidden.weight.shape) * 0.6)
    model.hidden.bias.assign(np.r_[30.0, -30.0, 30.0, -30.0, np.zeros(12)])
    return model


def batch(rng, size=32):
    return rng.integers(0, SMALL.vocab, size=(size, SMALL.context)), rng.integers(0, SMALL.vocab, size)


def numpy_forward_backward(params, contexts, targets):
    """The MLP by hand: the tanh activations and the gradient of every parameter."""
    emb, w, b, wo, bo = (params[n] for n in ("embedding.weight", "hidden.weight", "hidden.bias",
                                             "output.weight", "output.bias"))
    B = len(contexts)
    flat = emb[contexts].reshape(B, -1)  # (B, T·C)
    h = np.tanh(flat @ w + b)  # (B, H)
    logits = h @ wo + bo
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dlogits = p.copy()
    dlogits[np.arange(B), targets] -= 1
    dlogits /= B
    dh = dlogits @ wo.T
    dpre = dh * (1 - h**2)
    dflat = dpre @ w.T
    demb = np.zeros_like(emb)
    np.add.at(demb, contexts.reshape(-1), dflat.reshape(B * SMALL.context, SMALL.embed))
    grads = {"embedding.weight": demb, "hidden.weight": flat.T @ dpre, "hidden.bias": dpre.sum(0),
             "output.weight": h.T @ dlogits, "output.bias": dlogits.sum(0)}
    return h, grads


def test_statistics_match_numpy_on_the_same_tensors():
    model, rng = small_mlp(), np.random.default_rng(2)
    contexts, targets = batch(rng)
    before = {n: p.numpy() for n, p in model.named_parameters()}
    h, grads = numpy_forward_backward(before, contexts, targets)
    monitor = HealthMonitor(every=1, model=model)
    lr = 0.1
    assert monitor.wants(1)
    train_step("cpu64", model, SGD(lr), lambda tape: model.loss(tape, contexts, targets),
               observer=monitor)
    (record,) = monitor.records
    assert record["step"] == 1 and list(record["activations"]) == ["tanh(hidden)"]

    layer = record["activations"]["tanh(hidden)"]
    saturated = np.abs(h) > 0.97
    assert layer["saturated"] == pytest.approx(saturated.mean(), abs=1e-12)
    assert layer["dead"] == pytest.approx(saturated.all(axis=0).mean(), abs=1e-12)
    assert layer["dead"] == 4 / 16 and 0.25 < layer["saturated"] < 0.9  # the planted four, and more
    assert layer["mean"] == pytest.approx(h.mean()) and layer["std"] == pytest.approx(h.std())
    counts, edges = np.histogram(h, bins=40, range=(-1, 1))
    assert layer["counts"] == counts.tolist() and np.allclose(layer["edges"], edges)

    after = {n: p.numpy() for n, p in model.named_parameters()}
    assert list(record["parameters"]) == list(before)
    for name, stats in record["parameters"].items():
        g = grads[name]
        assert stats["grad_norm"] == pytest.approx(np.linalg.norm(g), rel=1e-9)
        assert stats["norm"] == pytest.approx(np.linalg.norm(before[name]), rel=1e-12)
        update = np.linalg.norm(after[name] - before[name])
        assert update == pytest.approx(lr * np.linalg.norm(g), rel=1e-9)  # SGD: Δp = −lr·g
        assert stats["update_norm"] == pytest.approx(update, rel=1e-9)
        size = np.linalg.norm(before[name])
        expected = None if size == 0 else math.log10(update / size)
        assert stats["update_ratio"] == (None if expected is None else pytest.approx(expected, abs=1e-9))
    assert record["parameters"]["hidden.bias"]["update_ratio"] is not None  # planted ±30: not zero
    assert record["loss"] == pytest.approx(-np.log(
        np.exp(h @ before["output.weight"] + before["output.bias"])[np.arange(32), targets]
        / np.exp(h @ before["output.weight"] + before["output.bias"]).sum(1)).mean())


class Frozen:
    """An optimizer that changes nothing."""

    def step(self, parameters, gradients):
        pass


def test_a_model_built_the_same_way_names_the_parameters_by_shape():
    model, rng = small_mlp(), np.random.default_rng(3)
    contexts, targets = batch(rng)
    by_template = HealthMonitor(every=1, model=Mlp(SMALL, backend="cpu64", seed=7))
    unnamed = HealthMonitor(every=1)
    for monitor in (by_template, unnamed):
        monitor.wants(1)
        train_step("cpu64", model, Frozen(), lambda tape: model.loss(tape, contexts, targets),
                   observer=monitor)
    assert list(by_template.records[0]["parameters"]) == model.parameter_names()
    assert list(unnamed.records[0]["parameters"])[0].startswith("leaf %")
    named, plain = by_template.records[0]["parameters"], unnamed.records[0]["parameters"]
    assert [s["grad_norm"] for s in named.values()] == [s["grad_norm"] for s in plain.values()]
    # nothing moves, and the ratio says so (None, not -inf in the JSON)
    assert all(s["update_norm"] == 0 and s["update_ratio"] is None
               for s in by_template.records[0]["parameters"].values())


def test_relu_layers_dead_units_and_labels_by_module():
    rng = np.random.default_rng(4)
    net = Module()
    net.layer1 = Linear(2, 8, backend="cpu64", rng=rng)
    net.layer2 = Linear(8, 3, backend="cpu64", rng=rng)
    net.layer1.bias.assign(np.r_[-50.0, -50.0, np.zeros(6)])  # two units off for every input
    x = rng.normal(size=(40, 2))
    w1, b1 = net.layer1.weight.numpy(), net.layer1.bias.numpy()
    monitor = HealthMonitor(every=1, model=net)

    def loss_fn(tape):
        h = tape.relu(net.layer1(tape, x))
        return tape.mean(tape.square(tape.relu(net.layer2(tape, h))))

    monitor.wants(1)
    train_step("cpu64", net, SGD(0.1), loss_fn, observer=monitor)
    layers = monitor.records[0]["activations"]
    assert list(layers) == ["relu(layer1)", "relu(layer2)"]
    h = np.maximum(x @ w1 + b1, 0)
    assert layers["relu(layer1)"]["saturated"] == pytest.approx((h <= 0).mean())
    assert layers["relu(layer1)"]["dead"] == pytest.approx((h <= 0).all(0).mean()) and \
        layers["relu(layer1)"]["dead"] >= 2 / 8
    counts, _ = np.histogram(h, bins=40, range=(0, h.max()))
    assert layers["relu(layer1)"]["counts"] == counts.tolist()


def test_activation_stats_by_hand():
    t = np.array([[0.99, -0.5, 0.98], [-0.99, 0.2, 0.1]])
    stats = activation_stats("tanh", t, bins=4)
    assert stats["saturated"] == 3 / 6 and stats["dead"] == 1 / 3  # unit 0 on both examples
    assert stats["counts"] == [1, 1, 2, 2]
    s = activation_stats("sigmoid", np.array([[0.01, 0.5], [0.99, 0.5]]))
    assert s["saturated"] == 0.5 and s["dead"] == 0.5
    with pytest.raises(SmallemError, match="no saturation rule"):
        activation_stats("exp", t)


def test_all_zero_weights_every_hidden_unit_identical_forever():
    """The seed's warning: with every weight at zero, all hidden units compute the same thing,
    receive the same gradient, and stay identical; only the output bias learns."""
    model = Mlp(SMALL, backend="cpu64", seed=0)
    for name, p in model.named_parameters():
        if name.endswith("weight"):
            p.assign(np.zeros(p.shape))
    from smallem.optim import AdamW

    rng = np.random.default_rng(5)
    monitor = HealthMonitor(every=5, model=model)
    losses = observed_steps(model, AdamW(1e-2), lambda tape: model.loss(tape, *batch(rng)), 20, monitor)
    w = model.hidden.weight.numpy()
    assert np.all(w == w[:, :1])  # every unit's incoming weights (a column) equal
    assert [r["step"] for r in monitor.records] == [1, 5, 10, 15, 20] and len(losses) == 20
    last = monitor.records[-1]["parameters"]
    assert last["hidden.weight"]["grad_norm"] == 0 and last["hidden.weight"]["update_ratio"] is None
    assert last["output.bias"]["update_norm"] > 0


def test_train_calls_the_observer_on_sampled_steps_only(tmp_path):
    calls = []

    class Spy(HealthMonitor):
        def after_backward(self, tape, loss_var, grads):
            calls.append(self._step)
            super().after_backward(tape, loss_var, grads)

    config = TrainConfig(backend="cpu", steps=7, batch=8, log_every=3, eval_every=6,
                         eval_batches=1, sizes=MlpConfig(context=4, embed=3, hidden=16))
    corpus = corpus_of(tmp_path)
    spy = Spy(every=3, model=build_model(config, "cpu64"))
    train(config, corpus=corpus, progress=False, log=None, observer=spy)
    assert calls == [1, 3, 6] and [r["step"] for r in spy.records] == [1, 3, 6]
    assert [r["step"] for r in spy.losses] == [3, 6, 7]  # the loop's history records
    assert spy.seconds > 0


def corpus_of(tmp_path):
    from smallem.data import load_corpus

    folder = tmp_path / "corpus"
    folder.mkdir(exist_ok=True)
    for k in range(12):
        (folder / f"doc{k:02}.txt").write_text(f"def f{k}(x):\n    return x * {k} + 1\n" * 20)
    return load_corpus(str(folder))


def test_command_line_writes_json_lines_that_load_back(tmp_path, capsys):
    corpus_of(tmp_path)
    log = tmp_path / "health.jsonl"
    code = main(["train", "--backend", "cpu", "--steps", "6", "--batch", "8", "--corpus",
                 str(tmp_path / "corpus"), "--log-every", "2", "--eval-every", "4",
                 "--health", str(log), "--health-every", "2"])
    assert code == 0 and f"written to {log}" in capsys.readouterr().out
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["kind"], e["step"]) for e in lines if e["kind"] == "health"] == \
        [("health", 1), ("health", 2), ("health", 4), ("health", 6)]
    health, losses = load_health(log)
    assert len(health) == 4 and [r["step"] for r in losses] == [2, 4, 6]
    assert list(health[0]["parameters"]) == ["embedding.weight", "hidden.weight", "hidden.bias",
                                             "output.weight", "output.bias"]
    log.write_text(log.read_text() + '{"kind": "health", "st')  # a run killed mid-line
    assert len(load_health(log)[0]) == 4
    fig = dashboard.figure(health, losses)
    assert len(fig.axes) >= 6


def test_bad_health_options_are_one_line(tmp_path, capsys):
    assert main(["train", "--health", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert main(["train", "--health", str(tmp_path / "h.jsonl"), "--health-every", "0"]) == 2
    assert "every must be" in capsys.readouterr().err
    with pytest.raises(SmallemError, match="not a JSON line"):
        (tmp_path / "bad.jsonl").write_text("nope\n{}\n")
        load_health(tmp_path / "bad.jsonl")


def test_live_dashboard_updates_one_display_in_place(monkeypatch):
    import IPython.display

    shown, updates = [], []

    class Handle:
        def update(self, obj):
            updates.append(obj)

    def fake_display(obj, display_id=False):
        shown.append(obj)
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    model, rng = small_mlp(), np.random.default_rng(6)
    # budget=1.0: every sample may draw (the frame budget itself: tests/test_dashboard_frames.py)
    live = dashboard.LiveDashboard(every=2, model=model, steps=6, interval=0.0, budget=1.0)
    live.redraw()  # before any sample: the status says it is starting
    live.on_record({"step": 0, "train_loss": None, "held_out_loss": 2.4, "seconds": 0.0})
    live.monitor.losses.clear()  # a loop without history records: redraws after updates
    observed_steps(model, SGD(0.05), lambda tape: model.loss(tape, *batch(rng)), 6, live)
    live.on_record({"step": 6, "train_loss": 1.0, "held_out_loss": 1.1, "seconds": 0.1})
    assert len(shown) == 1  # one figure, displayed once...
    assert len(updates) == live.redraws - 1 == 5  # ...then redrawn in place: a sample, a redraw
    assert [r["step"] for r in live.records] == [1, 2, 4, 6]
    assert updates[-1].data[:8] == b"\x89PNG\r\n\x1a\n"


def test_dead_units_are_zero_for_every_input(backend):
    # 3 inputs × 4 units: unit 1 is zero everywhere (dead), unit 3 is active on one input only
    # (alive: one input is enough to pass a gradient).
    layer1 = np.array([[0.5, 0.0, 2.0, 0.0],
                       [0.1, 0.0, 0.0, 0.0],
                       [0.0, 0.0, 1.0, 3.0]])
    layer2 = np.zeros((3, 2))  # everything dead
    acts = [backend.tensor(layer1), backend.tensor(layer2)]
    masks = dead_units(backend, acts)
    assert masks[0].tolist() == [False, True, False, False]
    assert masks[1].tolist() == [True, True]
    assert dead_fraction(backend, acts) == [0.25, 1.0]


def test_dead_fraction_reads_vars_and_leading_dims():
    tape = Tape()
    a = np.ones((2, 3, 4))  # [B, T, H]: every position counts as an input
    a[..., 2] = -1.0  # negative everywhere: what a pre-ReLU would be, dead too
    act = tape.relu(tape.leaf(a))
    assert dead_fraction("cpu64", [act]) == [0.25]


def test_dead_fraction_wants_a_data_set():
    with pytest.raises(SmallemError, match="dead_units: layer 0"):
        dead_fraction("cpu64", [np.zeros(4)])


def test_dead_units_of_tanh_are_saturated_on_every_input():
    """The same rule for every activation: a tanh unit is dead when |t| > 0.97 on every input."""
    layer = np.array([[0.99, 0.2, -0.98],
                      [-0.995, 0.99, -0.999]])
    assert dead_units("cpu64", [layer], "tanh")[0].tolist() == [True, False, True]
    assert activation_stats("tanh", layer)["dead"] == 2 / 3

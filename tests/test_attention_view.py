"""The attention view without a browser: its HTML from (bytes, weights), the widget's controls,
the weights read off a tape, and the recorded-run loader."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import smallem.course.common.recordings as recorded_module
from smallem import SmallemError, Tape
from smallem.course import attention
from smallem.course.common.attention import AttentionView, recorded_run, render_html, strongest
from smallem.data import encode

SPAN = re.compile(r'<span data-pos="(\d+)" data-weight="([0-9.]*)" style="([^"]*)"')


def _spans(markup):
    return [(int(p), w, s) for p, w, s in SPAN.findall(markup)]


def test_render_html_shades_the_past_by_weight_and_greys_the_future():
    tokens = encode("f(a)\nb")
    weights = np.array([0.1, 0.7, 0.2, 0.0, 0.0, 0.0])
    spans = _spans(render_html(tokens, weights, 2))
    assert [p for p, _, _ in spans] == list(range(6))
    assert [w for _, w, _ in spans] == ["0.1000", "0.7000", "0.2000", "", "", ""]
    assert "rgba(192,57,43,1.000)" in spans[1][2]  # the strongest weight: full colour
    assert "rgba(192,57,43,0.143)" in spans[0][2]  # 0.1 / 0.7
    assert "outline" in spans[2][2] and "outline" not in spans[1][2]
    assert all("color:#bbbbbb" in s for _, _, s in spans[3:])


def test_render_html_shows_invisible_bytes_and_escapes_markup():
    markup = render_html(np.append(encode("<a>\n \t"), 0), np.full(7, 1 / 7), 6)
    assert "&lt;" in markup and "<a>" not in markup
    assert "⏎</span><br>" in markup and ">·<" in markup and ">⇥<" in markup and "\\x00" in markup


def test_render_html_refuses_mismatched_input_in_one_sentence():
    with pytest.raises(SmallemError, match="one weight per byte"):
        render_html(encode("abc"), [0.5, 0.5], 1)
    with pytest.raises(SmallemError, match="outside the snippet"):
        render_html(encode("abc"), [1, 0, 0], 3)


def test_strongest_reads_only_the_visible_past():
    assert strongest([0.1, 0.5, 0.4, 0.9], 2, k=2) == [1, 2]


def _weights(layers=2, heads=3, t=6, seed=0):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(layers, heads, t, t)) * 2
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_view_follows_its_controls():
    tokens, weights = encode("x = (1)"), _weights(t=7)
    view = AttentionView(tokens, weights)
    assert view.position.value == 6 and view.position.max == 6 and view.head.max == 2
    before = view.text.value
    view.head.value = 1
    assert view.text.value != before
    shown = [float(w) for _, w, _ in _spans(view.text.value)]
    assert np.allclose(shown, weights[0, 1, 6], atol=1e-4)
    view.position.value, view.layer.value = 4, 1
    spans = _spans(view.text.value)
    assert [w for _, w, _ in spans[5:]] == ["", ""]
    assert np.allclose([float(w) for _, w, _ in spans[:5]], weights[1, 1, 4, :5], atol=1e-4)
    assert view.caption().startswith("layer 1 · head 1 · position 4 '(' · strongest: ")


def test_view_refuses_weights_of_the_wrong_shape():
    with pytest.raises(SmallemError, match=r"weights \(layers, heads, T, T\)"):
        AttentionView(encode("abc"), np.ones((1, 1, 4, 4)))


def test_stored_notebook_shows_a_sentence_not_the_widget_repr():
    bundle = AttentionView(encode("abc"), _weights(1, 1, 3))._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert data["text/plain"].startswith("The attention view appears here")


def test_attention_weights_reads_the_softmax_nodes_of_a_tape(monkeypatch):
    class Node:
        def __init__(self, op, value):
            self.op, self.value, self.name = op, value, op or "leaf"

    tape = Tape("cpu64")
    w = _weights(2, 3, 5)
    monkeypatch.setattr(tape, "nodes", [Node(None, np.zeros(2)), Node("softmax", w[0][None]),
                                        Node("matmul", np.zeros(3)), Node("softmax", w[1][None])])
    got = attention.attention_weights(tape)
    assert got.shape == (2, 1, 3, 5, 5) and np.array_equal(got[1, 0], w[1])
    with pytest.raises(SmallemError, match="no softmax node"):
        attention.attention_weights(Tape("cpu64"))


def test_recorded_placeholder_reads_as_none_and_a_real_run_as_its_data(tmp_path, monkeypatch):
    shipped = recorded_run("transformer_gpu")  # the H200 run of round 3, on the MLP's targets
    assert shipped["held_out_loss"] < shipped["mlp_held_out_loss"] and shipped["steps"] == 10_000
    with pytest.raises(SmallemError, match="no recorded result named 'nope'"):
        recorded_run("nope")
    folder = tmp_path / "recorded"
    folder.mkdir()
    (folder / "placeholder.json").write_text(json.dumps({"placeholder": True}))
    run = {"device": "H200", "held_out_loss": 1.15, "config": {"context": 64}, "steps": 100, "batch": 64,
           "wall_seconds": 1.0, "mlp_held_out_loss": 1.4585, "mlp": {}, "window16": {},
           "history": [{"step": 0, "held_out_loss": 5.5}, {"step": 50, "held_out_loss": None},
                       {"step": 100, "held_out_loss": 2.0}]}
    (folder / "run.json").write_text(json.dumps(run))
    (folder / "bad.json").write_text(json.dumps({"device": "H200"}))
    monkeypatch.setattr(recorded_module.resources, "files", lambda package: tmp_path)
    assert recorded_run("placeholder") is None  # a placeholder reads as no run
    assert recorded_run("run") == run
    steps, losses = attention.recorded_curve(run)
    assert steps.tolist() == [0, 100] and losses.tolist() == [5.5, 2.0]
    with pytest.raises(SmallemError, match="lacks config, steps, batch, wall_seconds, history"):
        recorded_run("bad")


def test_masked_softmax_is_exact_and_passes_finite_differences():
    from smallem.autodiff import check_gradients
    from smallem.course.common.attention import masked_softmax

    allowed = np.tril(np.ones((4, 4), bool))
    tape = Tape("cpu64")
    s = np.asarray(masked_softmax(tape, tape.leaf(np.full((2, 4, 4), 800.0)), allowed).value)
    assert np.all(s[:, ~allowed] == 0) and np.allclose(s.sum(-1), 1) and np.isfinite(s).all()
    fd = check_gradients(lambda t, x: masked_softmax(t, x, allowed),
                         [np.random.default_rng(0).normal(size=(2, 4, 4))])
    assert fd.passed, fd


def test_one_head_lm_sees_the_future_only_through_a_leaky_mask():
    from smallem.course.common.attention import OneHeadLM
    from smallem.data import sequences

    tokens = np.random.default_rng(0).integers(0, 256, 400).astype(np.uint16)
    x, y = sequences(tokens, np.array([20, 40]), 8)
    assert x.shape == y.shape == (2, 8) and np.array_equal(y[:, :-1], x[:, 1:])
    assert y[0, -1] == tokens[20] and np.array_equal(x[0], tokens[12:20])
    t = 8
    for k, sees_next in [(0, False), (1, True)]:
        model = OneHeadLM(np.tril(np.ones((t, t), bool), k=k), backend="cpu64", seed=1)
        model.value.weight.assign(np.random.default_rng(2).normal(size=(32, 32)))  # make v count
        changed = x.copy()
        changed[:, 5] = (changed[:, 5] + 1) % 256
        tape = Tape("cpu64")
        before, after = (np.asarray(model.logits(tape, v).value) for v in (x, changed))
        assert np.array_equal(before[:, :5], after[:, :5]) != sees_next  # position 4 reads byte 5?
        assert np.array_equal(before[:, :4], after[:, :4])
    loss = OneHeadLM(np.tril(np.ones((t, t), bool)), backend="cpu64").loss(Tape("cpu64"), x, y)
    assert abs(float(loss.value) - np.log(257)) < 0.05


def test_opener_distances_match_parentheses_per_document():
    from smallem.course.common.attention import opener_distances

    tokens = np.concatenate([encode("f(a(b), c)"), [256], encode(")(x)")])
    assert opener_distances(tokens) == {5: 2, 9: 8, 14: 2}  # the `)` after 256 has no opener


def test_losses_at_scores_the_mlp_and_a_sequence_model_alike():
    from smallem.course.common.attention import OneHeadLM, losses_at
    from smallem.models import Mlp

    tokens = np.random.default_rng(0).integers(0, 256, 300).astype(np.uint16)
    positions = np.array([16, 100, 299])
    for model in (Mlp(), OneHeadLM(np.tril(np.ones((16, 16), bool)))):
        got = losses_at(model, tokens, positions, 16, batch=2)
        assert got.shape == (3,) and np.allclose(got, np.log(257), atol=0.1)


def test_notebook_12_shows_a_recorded_run_once_one_is_shipped(capsys):
    """The placeholder makes notebook 12 skip its recorded-run plot; this runs that cell on a run
    with the required keys, so the file that replaces the placeholder cannot break the notebook."""
    from pathlib import Path

    import matplotlib
    import nbformat

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from smallem.course import plots
    from smallem.course.common.attention import RECORDED_KEYS, recorded_curve

    path = Path(__file__).resolve().parent.parent / "notebooks" / "12_transformer.ipynb"
    cell = next(c.source for c in nbformat.read(path, 4).cells
                if "recorded_run(\"transformer_gpu\")" in c.source)
    run = {"device": "NVIDIA H200", "config": {"context": 64}, "steps": 10_000, "batch": 64,
           "wall_seconds": 100.0, "held_out_loss": 1.15, "mlp_held_out_loss": 1.4585,
           "history": [{"step": 0, "held_out_loss": 5.55}, {"step": 10_000, "held_out_loss": 1.15}],
           "window16": {"steps": 6000, "batch": 256, "held_out_loss": 1.25,
                        "history": [{"step": 6000, "held_out_loss": 1.25}]},
           "mlp": {"steps": 20_000, "batch": 256, "history": [{"step": 20_000, "held_out_loss": 1.4585}]}}
    assert set(RECORDED_KEYS) <= set(run)
    exec(cell, {"recorded_run": lambda name: run, "recorded_curve": recorded_curve, "plots": plots,
                "plt": plt})
    assert "NVIDIA H200: 10,000 steps of 64 in 100 s, held-out 1.1500 against the MLP's 1.4585" in \
        capsys.readouterr().out
    plt.close("all")

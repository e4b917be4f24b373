"""lessons.heads: the windows that end on a `)`, every head's weights read off a model, the weight
one position gives chosen bytes, the T × T maps; and what notebook 12 shows of the shipped model
(its samples are the H200 run's, recorded with the package)."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import numpy as np
import pytest

from smallem import SmallemError, sample
from smallem.course import recorded, trained
from smallem.course.l12_transformer.heads import closing_windows, plot_head_maps, weight_on, weights_of
from smallem.data import encode
from smallem.models import Transformer, TransformerConfig

matplotlib.use("Agg")
LOG = Path(__file__).parents[2] / "benchmarks/results/round5/trained_gpu.log"


def test_closing_windows_end_on_a_closer_whose_opener_they_hold():
    text = encode("f(a, b)\ng(x(1), yy)\nh(abcdefgh)\n")
    windows, openers = closing_windows(text, 12, (3, 10))   # f's `)` is too early, (1)'s too near
    assert [bytes(w.tolist()).decode() for w in windows] == ["\ng(x(1), yy)", "\nh(abcdefgh)"]
    assert openers.tolist() == [2, 2]                        # the `(` the last `)` closes, not x's


def test_closing_windows_spaces_its_choice_and_refuses_what_cannot_be():
    text = encode("".join(f"call{i}(a{i})\n" for i in range(50)))
    windows, _ = closing_windows(text, 16, (3, 4), count=5)
    assert len(windows) == 5 and len({w.tobytes() for w in windows}) == 5
    with pytest.raises(SmallemError, match="inside the window"):
        closing_windows(text, 16, (3, 16))
    with pytest.raises(SmallemError, match=r"no `\)` of this text has its `\(` 10 to 12 bytes back"):
        closing_windows(text, 16, (10, 12))


def test_weight_on_reads_one_byte_or_sums_a_mask():
    rng = np.random.default_rng(0)
    w = rng.random((2, 3, 4, 5, 5))                                    # (L, N, H, T, T)
    targets = np.array([0, 4, 2])
    got = weight_on(w, 3, targets)
    assert got.shape == (2, 3, 4)
    assert got[1, 2, 3] == w[1, 2, 3, 3, 2] and got[0, 1, 0] == w[0, 1, 0, 3, 4]
    mask = np.zeros((3, 5), bool)
    mask[:, [1, 2]] = True
    assert np.allclose(weight_on(w, 3, mask), w[:, :, :, 3, 1] + w[:, :, :, 3, 2])


def test_weights_of_a_model_are_causal_rows_in_batches():
    model = Transformer(TransformerConfig(layers=2, width=16, heads=2, context=8), backend="cpu", seed=0)
    windows = np.random.default_rng(1).integers(0, 256, (5, 8))
    w = weights_of(model, windows, batch=2)                            # three batches
    assert w.shape == (2, 5, 2, 8, 8) and np.allclose(w.sum(-1), 1, atol=1e-5)
    assert np.all(w[..., np.triu_indices(8, 1)[0], np.triu_indices(8, 1)[1]] == 0)
    assert np.allclose(weights_of(model, windows[3:4])[:, 0], w[:, 3], atol=1e-6)


def test_head_maps_draw_every_head_with_the_mask_hidden():
    w = np.tril(np.ones((6, 6)))
    w = np.broadcast_to(w / w.sum(1, keepdims=True), (2, 3, 6, 6))
    fig = plot_head_maps(w, encode("f(a)bc"), position=4, target=1, title="t")
    maps = [ax for ax in fig.axes if ax.images and ax.get_title().startswith("block")]
    assert [ax.get_title() for ax in maps] == [f"block {b} · head {h}" for b in range(2) for h in range(3)]
    shown = maps[-1].images[0].get_array()
    assert shown.mask[0, 1] and not shown.mask[1, 0]                  # above the diagonal: masked
    assert np.isclose(shown[5, 0], np.sqrt(1 / 6)) and "'('" in maps[-1].get_xlabel()
    with pytest.raises(SmallemError, match=r"weights \(layers, heads, T, T\)"):
        plot_head_maps(np.ones((2, 6, 6)))


def test_the_recorded_samples_are_the_gpu_logs():
    log = LOG.read_text()
    samples = recorded("trained_samples")["samples"]
    assert len(samples) == 6 and {s["seed"] for s in samples} == {0, 1}
    for s in samples:
        header = f"=== prompt {s['prompt']} | seed {s['seed']} | temperature {s['temperature']}\n"
        assert header + s["prompt"] + s["text"] + "\n" in log
        assert len(s["text"].encode()) == 240
    assert len(re.findall(r"^=== prompt", log, re.M)) == 6


def test_the_shipped_model_writes_the_h200s_text_on_the_cpu():
    model, _ = trained("transformer_trained")
    first = recorded("trained_samples")["samples"][0]
    assert first["seed"] == 0
    here = sample(model, first["prompt"], 60, temperature=first["temperature"], seed=0)
    assert here == first["text"].encode()[:60].decode("utf-8", "ignore")

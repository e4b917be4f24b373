"""`smallem figures`: every figure is written as a PNG, the fast ones byte for byte the same on
a second run, the training ones with a tiny run on a small corpus (the real one takes minutes)."""

import matplotlib

matplotlib.use("Agg")  # headless: tests never open a window

import pytest

from smallem.errors import SmallemError
from smallem.tools import figures
from smallem.tools.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def is_png(path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_SIGNATURE


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """Twelve short documents: enough for a train/held-out split by document."""
    folder = tmp_path_factory.mktemp("corpus")
    for k in range(12):
        (folder / f"doc{k:02}.txt").write_text(
            f"def f{k}(x):\n    return x * {k} + 1  # the same shape, other numbers\n" * 40)
    return str(folder)


def test_fast_figures_are_pngs_and_the_same_bytes_twice(tmp_path):
    first = figures.make_figures(tmp_path / "a", figures.FAST, log=None)
    second = figures.make_figures(tmp_path / "b", figures.FAST, log=None)
    assert [p.name for p in first] == ["network_221.png", "learning_rate_cliff.png"]
    for a, b in zip(first, second):
        assert is_png(a) and a.stat().st_size > 10_000  # a drawing, not an empty canvas
        assert a.read_bytes() == b.read_bytes(), f"{a.name} differs between two runs"


def test_no_timestamp_nor_version_in_the_png(tmp_path):
    (path,) = figures.make_figures(tmp_path, ["network_221"], log=None)
    data = path.read_bytes()
    assert b"tIME" not in data and b"Software" not in data and b"matplotlib" not in data


def test_training_figures_with_a_tiny_run(tmp_path, small_corpus):
    runs = figures.Runs(steps=4, batch=8, eval_batches=1, corpus_path=small_corpus)
    written = figures.make_figures(tmp_path, figures.TRAINING, runs=runs, log=None)
    assert [p.name for p in written] == ["mlp_vs_bigram.png", "sgd_vs_adamw.png",
                                         "training_health.png"]
    assert all(is_png(p) for p in written)
    # The AdamW MLP run is shared by both figures: three runs, not four.
    assert sorted(runs._done) == [("bigram", "adamw", None),
                                  ("mlp", "adamw", None), ("mlp", "sgd", None)]


def test_command_line_only_one_figure(tmp_path, capsys):
    assert main(["figures", "--out", str(tmp_path), "--only", "network_221.png"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["network_221.png"]
    assert "network_221.png" in capsys.readouterr().out


def test_an_unknown_figure_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(SmallemError, match="unknown figure 'nope'"):
        figures.make_figures(tmp_path, ["nope"], log=None)
    assert main(["figures", "--out", str(tmp_path), "--only", "nope"]) == 2
    assert "choose among network_221" in capsys.readouterr().err

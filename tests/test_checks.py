"""The three checks: each passes on a correct model and fails when its condition is not met;
the CPU/GPU comparison is skipped, with a reason, where there is no GPU."""

import pytest

from smallem.data import load_corpus
from smallem.models.mlp import MlpConfig
from smallem.training.checks import (
    check_backends_agree,
    check_initial_loss,
    check_overfit,
    format_checks,
    loss_curve,
)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_bytes=300_000)


def test_initial_loss_is_ln_257(backend, corpus):
    result = check_initial_loss(backend, corpus=corpus)
    assert result.passed, str(result)
    assert abs(result.value - 5.5491) < 0.01


def test_initial_loss_fails_when_the_initialisation_is_too_large(corpus, monkeypatch):
    import smallem.nn

    monkeypatch.setattr(smallem.nn, "INIT_STD", 1.0)
    result = check_initial_loss("cpu", corpus=corpus)
    assert result.status == "fail" and result.value > 6


def test_overfit_one_batch(corpus):
    # A narrower MLP keeps this quick; `smallem checks` (test_cli) runs the full-size one.
    small = MlpConfig(embed=16, hidden=128)
    result = check_overfit("cpu", corpus=corpus, config=small, lr=1e-2)
    assert result.passed, str(result)
    assert check_overfit("cpu", corpus=corpus, config=small, max_steps=5).status == "fail"


def test_two_backends_agree(corpus):
    small = MlpConfig(embed=8, hidden=32)
    result = check_backends_agree("cpu", "cpu64", corpus=corpus, steps=20, every=5,
                                  config=small, batch=32)
    assert result.passed, str(result)
    assert result.value < 1e-4
    tight = check_backends_agree("cpu", "cpu64", corpus=corpus, steps=20, every=5,
                                 config=small, batch=32, tolerance=0.0)
    assert tight.status == "fail"  # float32 and float64 do differ, just not by much


def test_loss_curve_is_reproducible(corpus):
    small = MlpConfig(embed=8, hidden=32)
    a = loss_curve("cpu", corpus, 10, every=5, config=small, batch=16)
    assert list(a) == [5, 10] and a == loss_curve("cpu", corpus, 10, every=5, config=small, batch=16)


@pytest.mark.parametrize("cupy, reason", [(None, "CuPy is not installed"),
                                           ("a spec", "no CUDA device visible to CuPy")])
def test_no_gpu_means_skipped_with_the_true_reason(monkeypatch, cupy, reason):
    """Where CuPy is missing the skip says so, not that no device is visible."""
    from smallem.training import checks

    monkeypatch.setattr(checks, "gpu_available", lambda: False)
    monkeypatch.setattr(checks, "find_spec", lambda name: cupy if name == "cupy" else "other")
    result = check_backends_agree("cpu", "gpu")
    assert result.status == "skip" and result.detail.startswith(reason), result.detail
    assert "SKIP" in format_checks([result])


def test_each_check_is_announced_before_it_runs(monkeypatch, corpus):
    from smallem.training import checks

    events = []
    for name in ("check_initial_loss", "check_overfit", "check_backends_agree"):
        monkeypatch.setattr(checks, name, lambda *a, _n=name, **k: events.append(_n) or _n)
    checks.run_checks("cpu", corpus, announce=events.append)
    assert events == ["initial loss", "check_initial_loss", "overfit one batch", "check_overfit",
                      "cpu vs gpu loss", "check_backends_agree"]

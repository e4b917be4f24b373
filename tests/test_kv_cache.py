"""The Transformer's KV cache: cached logits equal the uncached ones (1e-12 in float64), one
position at a time and across the restarts generation makes, and `sample` draws from them."""

import numpy as np
import pytest

from smallem import SmallemError
from smallem.autodiff.tape import Tape
from smallem.backends import get_backend, gpu_available
from smallem.data import decode
from smallem.models.transformer import KVCache, Transformer, TransformerConfig
from smallem.training.generate import CachedScores, sample

GPU = pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")


def model(backend="cpu64", context=12):
    return Transformer(TransformerConfig(layers=2, width=16, heads=2, context=context),
                       get_backend(backend), seed=3)


def uncached(m, tokens):
    tape = Tape(m.parameters()[0].backend)
    be = m.parameters()[0].backend
    out = np.asarray(be.to_numpy(tape.value(m.logits(tape, np.array(tokens, dtype=np.int64)))), np.float64)
    tape.close()
    return out


def cached(m, tokens, cache):
    tape = Tape(m.parameters()[0].backend)
    out = tape.value(m.cached_logits(tape, np.array(tokens, dtype=np.int64), cache))
    tape.close()
    return np.asarray(m.parameters()[0].backend.to_numpy(out), np.float64)


@pytest.mark.parametrize("backend, tolerance", [
    ("cpu64", 1e-12), ("cpu", 1e-4), pytest.param("gpu", 1e-4, marks=[pytest.mark.gpu, GPU])])
def test_cached_logits_equal_the_uncached_ones_position_by_position(backend, tolerance):
    m = model(backend)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 257, (2, 12))  # a batch of two
    cache = KVCache(m.config, get_backend(backend), batch=2)
    first = cached(m, tokens[:, :5], cache)  # a prompt of five at once
    assert np.abs(first - uncached(m, tokens[:, :5])).max() < tolerance
    for t in range(5, 12):  # then one position each
        row = cached(m, tokens[:, t:t + 1], cache)[:, -1]
        reference = uncached(m, tokens[:, :t + 1])[:, -1]
        assert np.abs(row - reference).max() < tolerance * max(1.0, np.abs(reference).max())
    assert cache.length == 12


def test_a_full_cache_refuses_one_more_position():
    m = model()
    cache = KVCache(m.config, get_backend("cpu64"))
    cached(m, [list(range(12))], cache)
    with pytest.raises(SmallemError, match="holds 12 of 12 positions, no room for 1 more"):
        cached(m, [[1]], cache)


def test_generation_scores_equal_the_uncached_ones_across_restarts():
    m = model(context=8)
    scores = CachedScores(m, get_backend("cpu64"), 8)
    tokens = [10] * 7 + [256]
    rng = np.random.default_rng(1)
    restarts = 0
    for _ in range(40):  # five windows' worth: the cache restarts from its last half
        before = scores.cache
        z = scores(tokens)
        restarts += scores.cache is not before
        assert scores.cache.tokens == tokens[-len(scores.cache.tokens):]
        assert 8 // 2 < len(scores.cache.tokens) <= 8
        assert np.abs(z - uncached(m, [scores.cache.tokens])[0, -1]).max() < 1e-12
        tokens.append(int(rng.integers(0, 257)))
    assert restarts >= 8


def test_sample_draws_from_the_cached_scores_and_starts_as_the_uncached_one():
    m = model(context=16)
    text = sample(m, prompt="def ", n_bytes=30, temperature=0, cache=True)
    scores, tokens = CachedScores(m, get_backend("cpu64"), 16), [10] * 15 + [256] + list(b"def ")
    out = []
    for _ in range(30):  # greedy over the windows the cache reads, each scored uncached
        scores(tokens)
        tokens.append(int(np.argmax(uncached(m, [scores.cache.tokens])[0, -1])))
        out.append(tokens[-1])
    assert text == decode(out)
    kw = dict(prompt="def ", n_bytes=1, temperature=1.0, seed=5)  # one full window: the same draw
    assert sample(m, cache=True, **kw) == sample(m, cache=False, **kw)


@pytest.mark.parametrize("prompt, n_bytes", [("def ", 60), ("", 45)])
def test_sample_writes_the_same_text_with_and_without_its_cache(prompt, n_bytes):
    # One windowing policy: the cache reads exactly the positions the uncached window reads,
    # across several restarts (context 8: 60 bytes are many windows), so the whole text agrees.
    m = model(context=8)
    kw = dict(prompt=prompt, n_bytes=n_bytes, temperature=0)
    assert sample(m, cache=True, **kw) == sample(m, cache=False, **kw)


def test_the_shipped_transformer_writes_the_same_text_with_and_without_its_cache():
    from smallem.lessons import trained

    m, _ = trained("transformer_trained", backend="cpu64")
    kw = dict(prompt="def fibonacci(n):\n    ", n_bytes=40, temperature=0)
    cached_text = sample(m, cache=True, **kw)
    assert len(cached_text) > 20
    assert cached_text == sample(m, cache=False, **kw)


def test_a_model_of_a_fixed_window_reads_its_last_bytes_whatever_the_length():
    from smallem.models.mlp import Mlp, MlpConfig

    m = Mlp(MlpConfig(), get_backend("cpu64"), seed=0)  # it reads exactly `context` bytes
    text = sample(m, prompt="def ", n_bytes=3 * m.config.context, temperature=0)
    assert len(text.encode("utf-8", "surrogateescape")) >= 3 * m.config.context // 2

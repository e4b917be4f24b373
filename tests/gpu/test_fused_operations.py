"""The GPU's fused operations (cross-entropy, softmax, LayerNorm) against their reference
forwards and rules.
Skipped, with the reason, where CuPy sees no device."""

import numpy as np
import pytest
from gpu_shared import _close, _fused_vs_reference, _softmax_op

from smallem import CrossEntropy, Tape
from smallem.backends import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]


def test_cross_entropy_kernel_matches_rule_on_a_training_batch(gpu):
    """The fused kernels (fused["cross_entropy"] and its forward) against
    operations.CrossEntropy's rule, on the shape of a training step, with logits large enough
    to overflow a naive exp."""
    rng = np.random.default_rng(4)
    logits, targets = 30 * rng.normal(size=(256, 257)), rng.integers(0, 257, size=256)
    assert "cross_entropy" in gpu.fused and "cross_entropy" in gpu.fused_forward
    results = []
    for fused in (True, False):
        tape = Tape(gpu, fused=fused)
        x = tape.leaf(logits)
        loss = tape.mul(tape.apply(CrossEntropy(targets), [x]), 3.0)  # a grad other than 1
        results.append((gpu.item(loss.value), gpu.to_numpy(tape.backward(loss)[x])))
    assert np.isfinite(results[0][0])
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-6)


SOFTMAX_SHAPES = [(4, 2, 16, 16), (3, 64, 64), (2, 1, 1), (5, 70, 70), (7, 33), (1, 3, 40, 40)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
def test_fused_softmax_matches_its_reference_rule(gpu, shape, causal):
    """One kernel each way, against operations.Softmax's forward and rule in float64; masked
    weights and their gradients exactly 0; rows with one allowed entry (the first query) and
    scores of ±30 (a naive exp would overflow float32 beyond ±88) included."""
    Softmax = _softmax_op()
    if causal and (len(shape) < 2 or shape[-1] != shape[-2]):
        pytest.skip("a causal mask needs square (T, T) blocks")
    x = 30 * np.random.default_rng(16).normal(size=shape)
    fused, ref = _fused_vs_reference(gpu, lambda t, v: t.apply(Softmax(causal=causal), [v]),
                                        [x])
    assert fused[2]["softmax"] and not ref[2]["softmax"]
    _close(fused[0], ref[0], 1e-5)
    _close(fused[1][0], ref[1][0], 1e-4)
    if causal:
        n = shape[-1]
        masked = np.broadcast_to(np.triu(np.ones((n, n), bool), 1), shape)
        assert np.all(fused[0][masked] == 0) and np.all(fused[1][0][masked] == 0)
        np.testing.assert_allclose(fused[0].sum(-1), 1.0, rtol=1e-5)


def test_fused_softmax_declines_what_it_cannot_take(gpu):
    Softmax = _softmax_op()
    x = gpu.tensor(np.random.default_rng(17).normal(size=(4, 8, 16)))
    strided = x[:, :, ::2]
    assert gpu.fused_forward["softmax"](gpu, strided, Softmax(causal=False)) is None
    assert gpu.fused_forward["softmax"](gpu, x, Softmax(causal=True)) is None  # not square
    assert gpu.fused["softmax"](gpu, strided, strided, strided, Softmax(causal=False)) is None
    assert gpu.fused_forward["softmax"](gpu, x.astype(np.float64), Softmax(causal=False)) is None


@pytest.mark.parametrize("shape", [(64, 64, 128), (5, 7), (3, 1), (2, 3, 200), (1, 33)], ids=str)
def test_fused_layer_norm_matches_its_reference_rule(gpu, shape):
    """Forward in one launch; rule in two (dx, then dw and db as one column sum)."""
    from smallem.autodiff.operations import LayerNorm

    rng = np.random.default_rng(18)
    c = shape[-1]
    x = 3 + 2 * rng.normal(size=shape)  # an offset: the mean must really be taken out
    w, b = 1 + 0.3 * rng.normal(size=c), 0.1 * rng.normal(size=c)
    fused, ref = _fused_vs_reference(gpu, lambda t, *v: t.apply(LayerNorm(), list(v)),
                                        [x, w, b])
    assert fused[2]["layer_norm"] and not ref[2]["layer_norm"]
    _close(fused[0], ref[0], 2e-5)
    for got, want in zip(fused[1], ref[1]):
        _close(got, want, 1e-4)


@pytest.mark.parametrize("shape", [(16, 300, 512), (4096, 128), (7, 48), (3, 700, 600), (1, 33)], ids=str)
def test_layer_norm_rule_with_a_row_of_sums_per_warp_matches_the_reference(gpu, shape, monkeypatch):
    """ROW_SUMS (widths up to 512): each warp keeps its rows' sums of dy·x̂ and dy, the column
    sum adds a row per warp; dx is the per-row kernel's, bit for bit; dw and db the reference's.
    Wider rows (600) take the per-row kernel either way."""
    from smallem.autodiff.operations import LayerNorm
    from smallem.backends.cuda import layer_norm

    rng = np.random.default_rng(19)
    c = shape[-1]
    x = 3 + 2 * rng.normal(size=shape)
    w, b = 1 + 0.3 * rng.normal(size=c), 0.1 * rng.normal(size=c)
    ran, real = [], layer_norm.kernel
    monkeypatch.setattr(layer_norm, "kernel", lambda source, name: (ran.append(name), real(source, name))[1])
    results = {}
    for row_sums in (True, False):
        monkeypatch.setattr(layer_norm, "ROW_SUMS", row_sums)
        fused, ref = _fused_vs_reference(gpu, lambda t, *v: t.apply(LayerNorm(), list(v)), [x, w, b])
        assert fused[2]["layer_norm"]
        for got, want in zip(fused[1], ref[1]):
            _close(got, want, 1e-4)
        results[row_sums] = fused[1]
    assert ("layer_norm_backward_sums" in ran) == (c <= 512)
    assert np.array_equal(results[True][0], results[False][0])  # dx: one arithmetic


def test_fused_layer_norm_declines_what_it_cannot_take(gpu):
    from smallem.autodiff.operations import LayerNorm

    x = gpu.tensor(np.random.default_rng(19).normal(size=(6, 16)))
    w, b = gpu.tensor(np.ones(8)), gpu.tensor(np.zeros(8))
    assert gpu.fused_forward["layer_norm"](gpu, x[:, ::2], w, b, LayerNorm()) is None
    assert gpu.fused["layer_norm"](gpu, x[:, ::2], x[:, ::2], x[:, ::2], w, b,
                                   LayerNorm()) is None


def test_cross_entropy_over_many_rows_matches_the_rule(gpu):
    """A Transformer's loss: B·T = 4096 rows, above MANY_ROWS, where the forward takes a warp
    per row and a fixed-order mean instead of one block."""
    from smallem.backends.cuda.cross_entropy import MANY_ROWS

    rng = np.random.default_rng(21)
    logits, targets = 20 * rng.normal(size=(64, 64, 257)), rng.integers(0, 257, size=(64, 64))
    assert targets.size > MANY_ROWS
    values = []
    for fused in (True, False):
        tape = Tape(gpu, fused=fused)
        values.append(gpu.item(tape.apply(CrossEntropy(targets), [tape.leaf(logits)]).value))
    z = logits - logits.max(-1, keepdims=True)
    exact = float(np.mean(np.log(np.exp(z).sum(-1)) - np.take_along_axis(
        z, targets[..., None], -1)[..., 0]))
    assert values[0] == pytest.approx(exact, rel=1e-5)
    assert values[1] == pytest.approx(exact, rel=1e-5)

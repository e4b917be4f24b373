"""The fused attention Operation on the CPU: the unfused path's values and gradients, tiles that
never hold a T × T matrix, only O and the log-sum-exp kept, bad shapes refused in one sentence."""

import numpy as np
import pytest

from smallem.autodiff import Attention, Tape, attention, check_gradients
from smallem.autodiff.attention import tile_backward
from smallem.autodiff.operations import softmax
from smallem.backends import get_backend
from smallem.errors import SmallemError
from smallem.models.transformer import Transformer, TransformerConfig


def _unfused(tape, q, k, v, causal):
    scores = tape.div(q @ tape.transpose(k, -2, -1), float(np.sqrt(q.shape[-1])))
    return softmax(tape, scores, causal=causal) @ v


@pytest.mark.parametrize("causal, t, s, tile", [(True, 9, 9, 4), (True, 16, 16, 16), (True, 5, 5, 7),
                                                (False, 6, 11, 4), (False, 3, 1, 2)])
def test_values_and_gradients_match_the_unfused_path(causal, t, s, tile):
    rng = np.random.default_rng(t + s)
    q, k, v = rng.normal(size=(2, 3, t, 4)), rng.normal(size=(2, 3, s, 4)), rng.normal(size=(2, 3, s, 5))
    w = rng.normal(size=(2, 3, t, 5))
    out = {}
    for name, fn in (("fused", lambda tp, *x: attention(tp, *x, causal=causal, tile=tile)),
                     ("unfused", lambda tp, *x: _unfused(tp, *x, causal))):
        tape = Tape("cpu64")
        leaves = [tape.leaf(x) for x in (q, k, v)]
        y = fn(tape, *leaves)
        g = tape.backward(y, grad=w)
        out[name] = [y.value] + [g[x] for x in leaves]
    for a, b in zip(out["fused"], out["unfused"]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


class _Spy:
    """A backend that notes the shape of every tensor it makes (delegates to cpu64)."""

    def __init__(self):
        self.inner, self.shapes = get_backend("cpu64"), []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def spied(*a, **kw):
            out = attr(*a, **kw)
            if hasattr(out, "shape"):
                self.shapes.append(tuple(out.shape))
            return out
        return spied


def test_the_tiles_never_hold_a_t_by_t_matrix():
    be, t, tile = _Spy(), 24, 8
    rng = np.random.default_rng(0)
    q, k, v, g = (be.inner.tensor(rng.normal(size=(2, t, 4))) for _ in range(4))
    op = Attention(causal=True, tile=tile)
    o = op.forward(be, q, k, v)
    op.backward(be, g, o, q, k, v)
    assert (2, tile, tile) in be.shapes  # the weights of one tile: the largest square it holds
    assert not any(len(sh) == 3 and min(sh[-2:]) > tile for sh in be.shapes)


def test_the_node_keeps_its_output_and_the_log_sum_exp_only():
    rng = np.random.default_rng(1)
    tape = Tape("cpu64")
    q, k, v = (tape.leaf(rng.normal(size=(2, 3, 32, 4))) for _ in range(3))
    y = attention(tape, q, k, v)
    row = tape.memory().nodes[y.index]
    assert (row.bytes, row.saved) == (2 * 3 * 32 * 4 * 8, 2 * 3 * 32 * 8)
    (lse,) = tape.nodes[y.index].args[0].saved
    s = q.value @ k.value.swapaxes(-1, -2) / 2.0 + np.triu(np.full((32, 32), -np.inf), 1)
    np.testing.assert_allclose(lse[..., 0], np.log(np.exp(s).sum(-1)), rtol=1e-13)


def test_a_planted_tile_backward_is_the_one_gradcheck_sees():
    rng = np.random.default_rng(2)
    inputs = [rng.normal(size=(1, 5, 3)) for _ in range(3)]

    def wrong(be, q, k, v, do, lse, delta, scale, mask):
        dq, dk, dv = tile_backward(be, q, k, v, do, lse, delta, scale, mask)
        return dq, dk, be.mul(dv, 2.0)

    good = check_gradients(lambda t, *x: t.apply(Attention(tile=2), list(x)), inputs)
    bad = check_gradients(lambda t, *x: t.apply(Attention(tile=2, backward_tile=wrong), list(x)),
                          inputs)
    assert good.passed and not bad.passed


@pytest.mark.parametrize("shapes, causal, match", [
    (((2, 4, 3), (2, 4, 2), (2, 4, 3)), True, "do not fit"),
    (((2, 4, 3), (2, 5, 3), (2, 5, 3)), True, "must be as many"),
    (((4, 3), (4, 3), (3, 3)), False, "do not fit"),
    (((3,), (3,), (3,)), False, "do not fit")])
def test_bad_shapes_are_one_sentence(shapes, causal, match):
    tape = Tape("cpu64")
    with pytest.raises(SmallemError, match=match):
        attention(tape, *(tape.leaf(np.ones(s)) for s in shapes), causal=causal)


def test_a_bad_tile_is_refused():
    with pytest.raises(SmallemError, match="tile must be a whole number"):
        Attention(tile=0)


def test_the_transformer_fused_matches_unfused_in_float64():
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 257, (2, 40)), rng.integers(0, 257, (2, 40))
    out = {}
    for mode in ("fused", "unfused"):
        model = Transformer(TransformerConfig(context=40, attention=mode), "cpu64", seed=1)
        tape = Tape("cpu64")
        loss = model.loss(tape, x, y)
        g = tape.backward(loss)
        out[mode] = [tape.value(loss)] + [p.grad(g) for p in model.parameters()]
        assert ("attention" in tape.memory().by_op) == (mode == "fused")
    for a, b in zip(out["fused"], out["unfused"]):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 0, -1.0, "0.5", True])
def test_a_scale_that_is_no_positive_number_is_one_sentence(scale):
    with pytest.raises(SmallemError, match=f"attention: scale must be a positive number, got {scale!r}"):
        Attention(scale=scale)
    assert Attention(scale=np.float32(0.25)).factor(16) == 0.25  # NumPy's numbers are numbers


def test_the_transformer_asks_for_the_16_bit_copies_its_linears_read(monkeypatch):
    """Attention writes 16-bit copies of O and the gradients only where a bf16/fp16 product reads
    them (the GPU's tensor-core kernels; round 9): off unless asked, asked by the Transformer,
    whose Linears read all four; the numbers are the same either way."""
    from smallem.models import transformer

    assert Attention().copies is False and Attention(copies=True).copies is True
    asked = []
    real = transformer.attention

    def spy(*args, **kw):
        asked.append(kw.get("copies"))
        return real(*args, **kw)

    monkeypatch.setattr(transformer, "attention", spy)
    model = Transformer(TransformerConfig(context=8, attention="fused"), "cpu64", seed=1)
    x = np.random.default_rng(2).integers(0, 257, (2, 8))
    tape = Tape("cpu64")
    tape.backward(model.loss(tape, x, x))
    assert asked == [True] * model.config.layers

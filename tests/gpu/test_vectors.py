"""The four-floats-a-thread kernels (common.VECTORS): GELU and its rule and the add with a 16-bit
copy give the one-a-thread kernels' bits, copies included; GELU's rule keeps da's column sums for
the Linear before it (gelu.SUMS), equal to float64's and read by that Linear's rule; LayerNorm's
forward with the row in registers matches float64 and its 16-bit copy is its output rounded.
Sizes not a multiple of 4 take the old kernels. Skipped, with the reason, where CuPy sees no
device."""

import numpy as np
import pytest

from smallem.backends import gpu_available
from smallem.backends.precision import round_to

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]
SIZES = [(64, 2048), (3, 5, 128), (7, 3), (1, 1)]  # the last two: not multiples of 4


def _both(monkeypatch, run):
    """run() with VECTORS off, then on: host copies of what each returned."""
    from smallem.backends.cuda import common

    out = []
    for on in (False, True):
        monkeypatch.setattr(common, "VECTORS", on)
        out.append([np.asarray(a.get()) for a in run()])
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", SIZES)
def test_gelu_add_and_their_copies_are_the_same_bits_four_a_thread(shape, precision, monkeypatch):
    import cupy

    from smallem.backends import get_backend
    from smallem.backends.cuda import gelu, halves
    from smallem.backends.cuda.elementwise import add_with_copy

    be = get_backend("gpu", precision)
    rng = np.random.default_rng(2)
    x, g, z = (cupy.asarray(2 * rng.normal(size=shape), dtype=cupy.float32) for _ in range(3))

    def run():
        y = gelu.gelu(x, precision)
        (dx,) = gelu.gelu_rule(be, g, y, x)
        s = add_with_copy(x, z, precision)
        copies = [halves.lookup(a, precision) for a in (y, dx, s)] if halves.wanted(precision) else []
        assert all(c is not None for c in copies)
        return [y, dx, s, *copies]

    scalar, vector = _both(monkeypatch, run)
    for a, b in zip(scalar, vector):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("rows, c", [(300, 512), (64, 128), (9, 1024), (5, 64), (4, 50)])
def test_layer_norm_forward_four_a_thread_matches_float64(rows, c, precision, monkeypatch):
    import cupy

    from smallem.autodiff.operations import LayerNorm
    from smallem.backends import get_backend
    from smallem.backends.cuda import halves
    from smallem.backends.cuda.layer_norm import layer_norm_forward

    be = get_backend("gpu", precision)
    rng = np.random.default_rng(4)
    x, w, b = 3 + rng.normal(size=(rows, c)), 1 + 0.3 * rng.normal(size=c), rng.normal(size=c)
    args = [cupy.asarray(a, dtype=cupy.float32) for a in (x, w, b)]

    def run():
        y = layer_norm_forward(be, *args, LayerNorm())
        return [y] + ([halves.lookup(y, precision)] if halves.wanted(precision) else [])

    scalar, vector = _both(monkeypatch, run)
    x32, w32, b32 = (np.asarray(a.get(), np.float64) for a in args)
    mu = x32.mean(-1, keepdims=True)
    want = (x32 - mu) / np.sqrt(((x32 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w32 + b32
    for got in (scalar[0], vector[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    if precision == "bf16":  # the copy is the float32 output rounded, whichever kernel wrote it
        bits = round_to(vector[0], "bf16").astype(np.float32).view(np.uint32) >> 16
        assert np.array_equal(vector[1], bits.astype(np.uint16))


@pytest.mark.parametrize("rows, c", [(64, 2048), (3000, 512), (5, 36)])  # one chunk, 47, a tail
def test_gelu_rule_keeps_da_column_sums_for_the_linear_before_it(rows, c):
    import cupy

    from smallem import Tape
    from smallem.backends import get_backend
    from smallem.backends.cuda import gelu
    from smallem.backends.cuda.reductions import kept_sums
    from smallem.nn import Linear

    be = get_backend("gpu", "bf16")
    rng = np.random.default_rng(5)
    x, g = (cupy.asarray(2 * rng.normal(size=(rows, c)), dtype=cupy.float32) for _ in range(2))
    (dx,) = gelu.gelu_rule(be, g, gelu.gelu(x, "bf16"), x)
    sums = kept_sums(dx, c)
    assert sums is not None
    want = np.asarray(dx.get(), np.float64).sum(0)
    np.testing.assert_allclose(sums.get(), want, rtol=1e-5, atol=1e-5 * np.abs(dx.get()).sum(0).max())
    # in a tape: the Linear before GELU takes its db from those sums, equal to float64's sum of da
    layer = Linear(16, c, backend=be, rng=np.random.default_rng(1))
    tape = Tape(be)
    inp = tape.leaf(rng.normal(size=(rows, 16)))
    out = tape.gelu(layer(tape, inp))
    grads = tape.backward(tape.sum(tape.mul(out, tape.constant(rng.normal(size=(rows, c))))))
    steps_da = np.asarray(grads.node(out.index - 1).get(), np.float64)  # d(pre), GELU's rule's output
    np.testing.assert_allclose(layer.bias.grad(grads).get(), steps_da.sum(0), rtol=1e-5,
                               atol=1e-5 * np.abs(steps_da).sum(0).max())

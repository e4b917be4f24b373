"""q, k, v as one product on the GPU (backends/cuda/qkv.py): the qkv_attention node against float64
in fp32, against the three Linears and `attention` it replaces in every precision (the same
products' inputs, summed in another order), inside the Transformer (losses and every parameter's
gradient, plain and captured). Skipped, with the reason, where CuPy sees no device."""

import numpy as np
import pytest

from smallem import Tape
from smallem.backends import gpu_available
from smallem.backends.precision import get_format
from smallem.models.transformer import Transformer, TransformerConfig

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def _backend(precision, on):
    from smallem.backends.cuda import qkv
    from smallem.backends.cupy import CupyBackend

    kept, qkv.QKV = qkv.QKV, on  # read as the backend is made
    try:
        return CupyBackend(precision)
    finally:
        qkv.QKV = kept


def _grads(be, config, x, y):
    model = Transformer(config, be, seed=0)
    tape = Tape(be)
    loss = model.loss(tape, x, y)
    steps = list(tape.backward_steps(loss))
    g = tape.gradients
    ops = {s.op: s.fused for s in steps}
    return (float(be.to_numpy(loss.value)), [be.to_numpy(p.grad(g)).astype(np.float64)
                                             for p in model.parameters()], ops)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("width, heads", [(128, 4), (256, 4)], ids=["D32", "D64"])
def test_the_transformer_with_q_k_v_as_one_product_is_the_three_linears(precision, width, heads):
    """Same loss and every parameter's gradient as the path with three Linears, the node fused
    forward and backward; within 4 eps of the format (a float32 sum in another order can move
    one rounding to 16 bits inside the attention), 2e-5 in fp32."""
    config = TransformerConfig(width=width, heads=heads, context=64)
    rng = np.random.default_rng(6)
    x, y = rng.integers(0, 257, (4, 64)), rng.integers(0, 257, (4, 64))
    loss_on, on, ops = _grads(_backend(precision, True), config, x, y)
    loss_off, off, ops_off = _grads(_backend(precision, False), config, x, y)
    assert ops.get("qkv_attention") is True and "qkv_attention" not in ops_off
    tol = 2e-5 if precision == "fp32" else 4 * get_format(precision).eps
    assert abs(loss_on - loss_off) <= tol * abs(loss_off)
    for a, b in zip(on, off):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1e-3, np.abs(b).max()))


def test_the_node_matches_float64_in_fp32():
    """The fused forward and rule against cpu64's reference (float64), one node on its own."""
    from smallem.autodiff.qkv_attention import QkvAttention

    rng = np.random.default_rng(7)
    inputs = [rng.normal(size=(2, 70, 64))] + [p for _ in range(3) for p in
                                               (0.2 * rng.normal(size=(64, 64)), rng.normal(size=64))]
    up = rng.normal(size=(2, 2, 70, 32))
    results = []
    for backend in (_backend("fp32", True), "cpu64"):
        tape = Tape(backend)
        leaves = [tape.leaf(v) for v in inputs]
        out = tape.apply(QkvAttention(2), leaves)
        steps = list(tape.backward_steps(tape.sum(tape.mul(out, tape.constant(up)))))
        be = tape.backend
        results.append((be.to_numpy(out.value), [be.to_numpy(tape.gradients[v]) for v in leaves],
                        any(s.op == "qkv_attention" and s.fused for s in steps)))
    (out32, g32, fused), (out64, g64, _) = results
    assert fused
    np.testing.assert_allclose(out32, out64, rtol=1e-4, atol=2e-5 * max(1.0, np.abs(out64).max()))
    for a, b in zip(g32, g64):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5 * max(1.0, np.abs(b).max()))


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_captured_step_with_q_k_v_as_one_product_is_the_plain_one(precision):
    """Ten captured steps (AdamW) give the plain steps' losses: the joins, the product and the
    split of dW replay on each step's new weights."""
    from smallem.optim import AdamW
    from smallem.training.step import make_step

    config = TransformerConfig(context=64)
    rng = np.random.default_rng(8)
    batches = [(rng.integers(0, 257, (8, 64)), rng.integers(0, 257, (8, 64))) for _ in range(10)]
    losses = []
    for capture in (False, True):
        be = _backend(precision, True)
        model = Transformer(config, be, seed=0)
        step = make_step(be, model, AdamW(lr=3e-3), capture=capture)
        losses.append([float(be.to_numpy(step(*b))) for b in batches])
    tol = 1e-5 if precision == "fp32" else 4 * get_format(precision).eps
    np.testing.assert_allclose(losses[1], losses[0], rtol=tol)

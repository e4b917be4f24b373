"""The GPU's elementwise kernels (cuda/elementwise.py, cuda/gelu.py) against NumPy and the
reference rules: every unary and binary fast path, tanh's and the bias add's fused rules, GELU.
Skipped, with the reason, where CuPy sees no device."""

import numpy as np
import pytest
from gpu_shared import _close, _fused_vs_reference, _transformer_pieces

from smallem import Tape
from smallem.backends import get_backend, gpu_available
from smallem.backends.cuda.elementwise import UNARY

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]


def test_fused_tanh_rule_matches_the_tape_rule(gpu):
    """fused["tanh"] (one launch) against primitives.RULES["tanh"] (three), on a hidden
    layer; a fused rule that cannot take its input declines, and the reference runs."""
    assert "tanh" in gpu.fused
    x = np.random.default_rng(12).normal(size=(256, 512))
    strided = gpu.tensor(x)[:, ::2]
    assert gpu.fused["tanh"](gpu, strided, strided, strided) is None
    grads = []
    for fused in (True, False):
        tape = Tape(gpu, fused=fused)
        leaf = tape.leaf(x)
        loss = tape.sum(tape.mul(tape.tanh(leaf), tape.constant(np.cos(x))))
        grads.append(gpu.to_numpy(tape.backward(loss)[leaf]))
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6, atol=1e-7)


def test_sigmoid_keeps_its_relative_precision_on_both_tails(gpu):
    """σ(−40) = 4.25e-18, not 0: float32 holds it (its smallest normal is 1.2e-38)."""
    x = np.array([-80.0, -40.0, -20.0, -1.0, 0.0, 1.0, 20.0, 40.0])
    exact = 1.0 / (1.0 + np.exp(-x))
    got = gpu.to_numpy(gpu.sigmoid(gpu.tensor(x))).astype(np.float64)
    np.testing.assert_allclose(got, exact, rtol=1e-6)


@pytest.mark.parametrize("sa, sb", [((256, 512), (256, 512)), ((256, 512), (512,)),
                                    ((4, 3), (1, 3)), ((2, 4, 3), (3,)), ((4, 3), ()),
                                    ((3,), (4, 3)), ((4, 3), (4, 1)), ((), ())])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_elementwise_fast_paths_match_numpy(gpu, op, sa, sb):
    rng = np.random.default_rng(7)
    a, b = rng.normal(size=sa), rng.uniform(0.5, 2.0, size=sb)
    fn = getattr(np, {"add": "add", "sub": "subtract", "mul": "multiply", "div": "divide"}[op])
    for x, y in ((a, b), (b, a)):
        out = getattr(gpu, op)(gpu.tensor(x), gpu.tensor(y))
        np.testing.assert_allclose(gpu.to_numpy(out), fn(x, y), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gpu.to_numpy(getattr(gpu, op)(gpu.tensor(a), 1.5)), fn(a, 1.5),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gpu.to_numpy(getattr(gpu, op)(1.5, gpu.tensor(b))), fn(1.5, b),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_fast_paths_match_numpy(gpu, name):
    x = np.random.default_rng(8).uniform(0.1, 3.0, size=(37, 11)) * np.array([1, -1] * 5 + [1])
    x = np.abs(x) if name in ("log", "sqrt") else x
    cpu = get_backend("cpu64")
    np.testing.assert_allclose(gpu.to_numpy(getattr(gpu, name)(gpu.tensor(x))),
                               getattr(cpu, name)(x), rtol=2e-6, atol=1e-6)




@pytest.mark.parametrize("sa, sb", [((6, 10, 7), (7,)), ((6, 10, 7), (10, 7)), ((300, 9), (9,)),
                                    ((2, 3, 4, 5), (4, 5))], ids=str)
def test_fused_bias_add_rule_sums_every_leading_row_at_once(gpu, sa, sb):
    """fused["add"] for x + bias: db in one column sum over all leading rows, as the reference
    rule and unbroadcast give one dimension at a time; same shapes and scalars decline."""
    rng = np.random.default_rng(24)
    x, b, up = rng.normal(size=sa), rng.normal(size=sb), rng.normal(size=sa)
    grads = []
    for fused in (True, False):
        tape = Tape(gpu, fused=fused)
        vx, vb = tape.leaf(x), tape.leaf(b)
        loss = tape.sum(tape.mul(tape.add(vx, vb), tape.constant(up)))
        steps = list(tape.backward_steps(loss))
        assert any(s.op == "add" and s.fused for s in steps) == fused
        grads.append([gpu.to_numpy(tape.gradients[v]) for v in (vx, vb)])
    np.testing.assert_allclose(grads[0][1], up.reshape((-1,) + sb).sum(0), rtol=1e-5, atol=1e-4)
    for f, r in zip(*grads):
        np.testing.assert_allclose(f, r, rtol=1e-5, atol=1e-4)
    same = gpu.tensor(x)
    assert gpu.fused["add"](gpu, same, same, same, same) is None
    assert gpu.fused["add"](gpu, same, same, same, gpu.tensor(np.float64(2.0))) is None


# fused Transformer kernels (cuda/softmax, layer_norm, gelu) against their reference rules -------------------


@pytest.mark.parametrize("shape", [(64, 64, 512), (7,), (3, 5)], ids=str)
def test_fused_gelu_matches_its_reference_rule(gpu, shape):
    """The backend's gelu (one launch) and fused["gelu"] against the primitive's reference
    forward and rule in float64, over values from −12 to 12 (both saturated tails)."""
    _transformer_pieces()
    if "gelu" not in __import__("smallem.autodiff.primitives", fromlist=["RULES"]).RULES:
        pytest.skip("no gelu primitive on this branch yet")
    x = np.random.default_rng(20).uniform(-12, 12, size=shape)
    from smallem.autodiff.operations import OPERATIONS

    def gelu(tape, v):  # the primitive, or an operation of that name
        return tape.gelu(v) if hasattr(tape, "gelu") else tape.apply(OPERATIONS["gelu"](), [v])

    fused, ref = _fused_vs_reference(gpu, gelu, [x])
    assert fused[2]["gelu"] and not ref[2]["gelu"]
    _close(fused[0], ref[0], 2e-5)
    _close(fused[1][0], ref[1][0], 2e-5)
    assert gpu.fused["gelu"](gpu, gpu.tensor(x), gpu.tensor(x), gpu.tensor(x)[..., ::2]) is None

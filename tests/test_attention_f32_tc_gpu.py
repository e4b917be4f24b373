"""The float32 attention's 3xTF32 kernels (backends/cuda/attention_f32_tc.py) against float64 on
the GPU: the tensor cores' split products must keep the float32 tests' bound (1e-5), at every
width they are picked for, causal and not, odd lengths and T = 1."""

import numpy as np
import pytest
from test_attention_fused_gpu import probabilities, reference, run

from smallem.backends import get_backend, gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]


def scales(q, k, v, g, causal):
    """Float64 sizes to measure each output's error against: ‖O‖, ‖dV‖, and for dQ, dK the norm of
    the same products with dS = P ∘ (dP − δ) replaced by P ∘ (|dP| + |δ|) and |K|, |Q|: the size of
    the terms that cancel. At T = 1 dQ = dK = 0 exactly (dP = δ), and what float32 leaves of dP − δ
    is that size times float32's eps, not zero: round 13's last call measured 1.1e-5 of ‖dQ‖ = 1."""
    p = probabilities(q, k, causal)
    o = p @ v
    size = p * (np.abs(g @ v.swapaxes(-1, -2)) + np.abs((g * o).sum(-1, keepdims=True))) / \
        np.sqrt(q.shape[-1])
    return [np.linalg.norm(o), np.linalg.norm(size @ np.abs(k)),
            np.linalg.norm(size.swapaxes(-1, -2) @ np.abs(q)), np.linalg.norm(p.swapaxes(-1, -2) @ g)]


def rel(a, b, size):
    """‖a − b‖ / max(‖b‖, size)."""
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), size))


@pytest.mark.parametrize("b, t, s, h, d, causal", [
    (2, 100, 100, 2, 64, True), (1, 257, 257, 4, 64, True), (2, 70, 90, 2, 64, False),
    (1, 1, 1, 1, 64, True), (1, 333, 333, 2, 128, True), (2, 70, 90, 2, 128, False),
    (1, 1, 1, 2, 128, True), (1, 600, 600, 2, 128, True), (2, 31, 47, 3, 128, False)])
def test_the_3xtf32_kernels_match_float64(b, t, s, h, d, causal, monkeypatch):
    """O, dQ, dK, dV within 1e-5 of float64 with the tensor-core kernels taken (flash: the forward
    where TC lists d, the backward TCB's tiles at every T, FROM's aside)."""
    from smallem.backends.cuda import attention as kernels
    from smallem.backends.cuda import attention_f32_tc, attention_f32_tc_grad

    monkeypatch.setattr(kernels, "FLOAT32", "flash")
    assert d in attention_f32_tc.TC or d in attention_f32_tc_grad.TCB
    monkeypatch.setattr(attention_f32_tc_grad, "FROM", {})  # at every T, these short ones too
    rng = np.random.default_rng(t * d + s)
    xs = [rng.normal(size=(b, n, h, d)) for n in (t, s, s, t)]
    got, ran = run(get_backend("gpu"), [x.astype(np.float32) for x in xs], causal)
    assert ran == (True, True)
    ref = reference(*(x.swapaxes(1, 2) for x in xs), causal)
    errors = [rel(a, r, size) for a, r, size in
              zip(got, ref, scales(*(x.swapaxes(1, 2) for x in xs), causal))]
    assert all(np.isfinite(a).all() for a in got) and max(errors) < 1e-5, errors



def test_the_backward_takes_the_3xtf32_kernel_from_its_t(monkeypatch):
    """attention_f32_tc_grad.FROM: at a width in TCB the 3xTF32 backward runs from that T on and
    the FFMA backward below it (each within 1e-5 of float64), and the bench's units say which."""
    from smallem.backends.cuda import attention as kernels
    from smallem.backends.cuda import attention_f32, attention_f32_tc_grad

    monkeypatch.setattr(kernels, "FLOAT32", "flash")
    monkeypatch.setattr(attention_f32_tc_grad, "FROM", {128: 200})
    ran = []
    for module in (attention_f32, attention_f32_tc_grad):
        backward = module.backward
        monkeypatch.setattr(module, "backward", lambda *a, _b=backward, _m=module.__name__:
                            ran.append(_m.rsplit(".", 1)[1]) or _b(*a))
    for t in (199, 200):
        rng = np.random.default_rng(t)
        xs = [rng.normal(size=(1, t, 2, 128)) for _ in range(4)]
        got, _ = run(get_backend("gpu"), [x.astype(np.float32) for x in xs], True)
        ref = reference(*(x.swapaxes(1, 2) for x in xs), True)
        sizes = scales(*(x.swapaxes(1, 2) for x in xs), True)
        assert max(rel(a, r, size) for a, r, size in zip(got, ref, sizes)) < 1e-5
    assert ran == ["attention_f32", "attention_f32_tc_grad"]
    assert [kernels.float32_units(128, t) for t in (199, 200)] == ["3xTF32 fwd, FFMA bwd", "3xTF32"]

"""The float32 attention's 3xTF32 kernels (backends/cuda/attention_f32_tc.py) against float64 on
the GPU: the tensor cores' split products must keep the float32 tests' bound (1e-5), at every
width they are picked for, causal and not, odd lengths and T = 1."""

import numpy as np
import pytest
from test_attention_fused_gpu import reference, run

from smallem.backends import get_backend, gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]


def rel(a, b):
    """‖a − b‖ / max(‖b‖, 1): T = 1's gradients are exactly zero in float64 (and ~1e-8 here)."""
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1.0))


@pytest.mark.parametrize("b, t, s, h, d, causal", [
    (2, 100, 100, 2, 64, True), (1, 257, 257, 4, 64, True), (2, 70, 90, 2, 64, False),
    (1, 1, 1, 1, 64, True), (1, 333, 333, 2, 128, True), (2, 70, 90, 2, 128, False),
    (1, 1, 1, 2, 128, True), (1, 600, 600, 2, 128, True), (2, 31, 47, 3, 128, False)])
def test_the_3xtf32_kernels_match_float64(b, t, s, h, d, causal, monkeypatch):
    """O, dQ, dK, dV within 1e-5 of float64 with the tensor-core kernels taken (flash, d in TC;
    the backward TCB's tiles, TRIED's while TCB is empty)."""
    from smallem.backends.cuda import attention as kernels
    from smallem.backends.cuda import attention_f32_tc, attention_f32_tc_grad

    monkeypatch.setattr(kernels, "FLOAT32", "flash")
    assert d in attention_f32_tc.TC
    tcb = {**attention_f32_tc_grad.TRIED, **attention_f32_tc_grad.TCB}
    monkeypatch.setattr(attention_f32_tc_grad, "TCB", tcb)
    monkeypatch.setattr(attention_f32_tc_grad, "SOURCE", attention_f32_tc_grad.source(tcb))
    rng = np.random.default_rng(t * d + s)
    xs = [rng.normal(size=(b, n, h, d)) for n in (t, s, s, t)]
    got, ran = run(get_backend("gpu"), [x.astype(np.float32) for x in xs], causal)
    assert ran == (True, True)
    ref = reference(*(x.swapaxes(1, 2) for x in xs), causal)
    errors = [rel(a, r) for a, r in zip(got, ref)]
    assert all(np.isfinite(a).all() for a in got) and max(errors) < 1e-5, errors


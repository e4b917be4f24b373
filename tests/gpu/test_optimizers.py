"""The GPU's fused optimizer kernels (cuda/optimizers.py) against the update formulas in float64.
Skipped, with the reason, where CuPy sees no device."""

import numpy as np
import pytest

from smallem.backends import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]


def adamw_reference(p, g, m, v, *, lr, beta1, beta2, eps, weight_decay, bc1, bc2):
    """The update as the article writes it, in float64."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - lr * ((m / bc1) / (np.sqrt(v / bc2) + eps) + weight_decay * p)
    return p, m, v


def test_fused_adamw_over_many_tensors_matches_the_formula(gpu):
    """One launch for every tensor (more than 8, so the launches are chunked), each with its
    own decay and its own step count t, over several steps."""
    rng = np.random.default_rng(5)
    shapes = [(257, 32), (512,), (1,), (33, 7), (5,), (3, 3), (2,), (4, 4), (9,), (1, 1)]
    decays = [0.0, 0.1, 0.0, 0.1, 0.0, 0.1, 0.0, 0.1, 0.0, 0.1]
    late = [0, 0, 2, 0, 1, 0, 0, 3, 0, 0]  # some tensors start counting later
    host = [[rng.normal(size=s), np.zeros(s), np.zeros(s)] for s in shapes]
    dev = [[gpu.tensor(p), gpu.tensor(m), gpu.tensor(v)] for p, m, v in host]
    kw = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8)
    for step in range(1, 6):
        grads = [rng.normal(size=s) * 10 ** rng.uniform(-3, 1) for s in shapes]
        ts = [max(step - k, 1) for k in late]
        gpu.adamw_update([d[0] for d in dev], [gpu.tensor(g) for g in grads],
                         [d[1] for d in dev], [d[2] for d in dev], steps=ts,
                         weight_decays=decays, **kw)
        for h, g, wd, t in zip(host, grads, decays, ts):
            h[:] = adamw_reference(*h[:1], g, *h[1:], weight_decay=wd, bc1=1 - 0.9 ** t,
                                   bc2=1 - 0.999 ** t, **kw)
    # float32 rounding: m can cancel down to ~1e-3 from gradients of ~10, so its error is
    # measured against the gradients' size; v (a sum of squares) and p keep relative accuracy
    for (p, m, v), (dp, dm, dv) in zip(host, dev):
        np.testing.assert_allclose(gpu.to_numpy(dm), m, rtol=1e-5, atol=1e-6 * 10)
        np.testing.assert_allclose(gpu.to_numpy(dv), v, rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(gpu.to_numpy(dp), p, rtol=1e-5, atol=1e-6)
    # first step (t = 1): every element moves by lr, whatever the gradient's size
    p, g = gpu.tensor(np.zeros(100)), gpu.tensor(rng.normal(size=100) * 1e3)
    m, v = gpu.zeros((100,)), gpu.zeros((100,))
    gpu.adamw_update([p], [g], [m], [v], steps=[1], weight_decays=[0.0], **kw)
    np.testing.assert_allclose(np.abs(gpu.to_numpy(p)), 1e-2, rtol=1e-5)


def test_fused_sgd_matches_the_formula(gpu):
    rng = np.random.default_rng(6)
    shapes = [(300, 7), (1,), (64,)]
    ps, gs = [rng.normal(size=s) for s in shapes], [rng.normal(size=s) for s in shapes]
    dev = [gpu.tensor(p) for p in ps]
    gpu.sgd_update(dev, [gpu.tensor(g) for g in gs], lr=0.1)
    gpu.sgd_update(dev[:1], [gpu.tensor(gs[0])], lr=0.1)
    for k, (p, g, d) in enumerate(zip(ps, gs, dev)):
        expected = p - 0.1 * g - (0.1 * g if k == 0 else 0)
        np.testing.assert_allclose(gpu.to_numpy(d), expected, rtol=1e-5, atol=1e-6)

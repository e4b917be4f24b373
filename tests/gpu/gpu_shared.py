"""Helpers the GPU test files share (fused against reference, tolerances)."""

import numpy as np
import pytest

from smallem import Tape


def _fused_vs_reference(gpu, build, inputs, seed=15):
    """build(tape, *leaves) -> output Var. The GPU with its fused kernels against cpu64's
    reference rules on the same inputs and a random upstream gradient: (fused outputs and
    gradients, reference ones, whether each fused node really ran fused)."""
    results = []
    for backend in (gpu, "cpu64"):
        tape = Tape(backend)
        leaves = [tape.leaf(x) for x in inputs]
        out = build(tape, *leaves)
        up = np.random.default_rng(seed).normal(size=out.shape)
        loss = tape.sum(tape.mul(out, tape.constant(up)))
        steps = list(tape.backward_steps(loss))
        be = tape.backend
        results.append((be.to_numpy(out.value).astype(np.float64),
                        [be.to_numpy(tape.gradients[v]).astype(np.float64) for v in leaves],
                        {s.op: s.fused for s in steps}))
    return results


def _close(got, want, tol=2e-5):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def _transformer_pieces():
    """Importing the model registers what it needs (a stand-in model brings its own)."""
    try:
        import smallem.models.transformer  # noqa: F401
    except ImportError:
        pass


def _softmax_op():
    from smallem.autodiff.operations import OPERATIONS

    _transformer_pieces()
    if "softmax" not in OPERATIONS:
        pytest.skip("no softmax operation on this branch yet")
    return OPERATIONS["softmax"]

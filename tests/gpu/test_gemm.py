"""Matrix products on the GPU (cuda/gemm.py): cuBLAS on transposed views, batched layouts, the
Linear rule as one GEMM each way; and the column sums of a bias gradient (cuda/reductions.py).
Skipped, with the reason, where CuPy sees no device."""

import numpy as np
import pytest

from smallem import Tape
from smallem.backends import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]


@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_through_cublas_reads_transposed_views(gpu, ta, tb):
    rng = np.random.default_rng(9)
    a, b = rng.normal(size=(37, 19)), rng.normal(size=(19, 23))
    da = gpu.transpose(gpu.tensor(a.T.copy()), 0, 1) if ta else gpu.tensor(a)
    db = gpu.transpose(gpu.tensor(b.T.copy()), 0, 1) if tb else gpu.tensor(b)
    np.testing.assert_allclose(gpu.to_numpy(gpu.matmul(da, db)), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 256, 257, 4096, 5001])
def test_column_sums_one_pass_and_chunked_match_numpy(gpu, rows):
    """Up to 256 rows one launch, beyond in chunks of 128 then a sum of the chunks."""
    x = np.random.default_rng(23).normal(size=(rows, 70))
    np.testing.assert_allclose(gpu.to_numpy(gpu.sum(gpu.tensor(x), 0)), x.sum(0),
                               rtol=1e-5, atol=1e-4)


def test_sum_over_first_dim_matches_numpy(gpu):
    x = np.random.default_rng(10).normal(size=(1000, 3, 37))
    np.testing.assert_allclose(gpu.to_numpy(gpu.sum(gpu.tensor(x), 0)), x.sum(0), atol=1e-4)
    np.testing.assert_allclose(gpu.to_numpy(gpu.sum(gpu.tensor(x), 0, keepdim=True)),
                               x.sum(0, keepdims=True), atol=1e-4)


def _swapped(gpu, x):
    """x (..., r, c) as the tape's transpose(-1, -2) of a row-major (..., c, r) array."""
    return gpu.transpose(gpu.tensor(np.swapaxes(x, -1, -2).copy()), -1, -2)


def _heads(gpu, x):
    """x (B, H, T, D) as attention makes it: (B, T, H, D) row-major, transposed (1, 2)."""
    return gpu.transpose(gpu.tensor(np.swapaxes(x, 1, 2).copy()), 1, 2)


# (shape of a, shape of b, how a is laid out, how b is): attention's q·kᵀ and p·v and their
# rules (dC·Bᵀ, Aᵀ·dC), a Linear over (B, T, C) and its rules, stretched batches, split heads.
LAYOUTS = [((3, 4, 16, 8), (3, 4, 8, 16), "row", "swapped"),  # q·kᵀ
           ((3, 4, 16, 16), (3, 4, 16, 8), "row", "row"),  # p·v
           ((3, 4, 16, 8), (3, 4, 8, 16), "row", "row"),  # dp = dy·vᵀ with vᵀ materialized
           ((3, 4, 16, 16), (3, 4, 16, 8), "swapped", "row"),  # dv = pᵀ·dy
           ((3, 4, 16, 8), (3, 4, 8, 16), "swapped", "swapped"),
           ((5, 7, 12), (12, 9), "row", "row"),  # Linear over (B, T, C): rows folded
           ((5, 7, 12), (12, 9), "row", "swapped"),  # its dx = dy·Wᵀ
           ((5, 7, 12), (12, 9), "swapped", "row"),
           ((7, 12), (5, 12, 9), "row", "row"),  # one matrix against a batch: stride 0
           ((2, 1, 6, 5), (1, 3, 5, 4), "row", "row"),  # stretched on some dims: copied
           ((1, 6, 5), (4, 5, 3), "row", "swapped"),
           ((3, 4, 16, 8), (3, 4, 8, 16), "heads", "swapped"),  # heads split by transpose(1, 2)
           ((3, 4, 16, 8), (3, 4, 8, 16), "heads", "heads"),
           ((33, 17), (17, 65), "swapped", "swapped")]


def _operand(gpu, x, how):
    return {"row": gpu.tensor, "swapped": lambda v: _swapped(gpu, v),
            "heads": lambda v: _heads(gpu, v)}[how](x)


@pytest.mark.parametrize("sa, sb, la, lb", LAYOUTS, ids=[f"{a}x{b}-{la}-{lb}" for a, b, la, lb
                                                           in LAYOUTS])
def test_batched_matmul_matches_numpy_on_every_layout(gpu, sa, sb, la, lb):
    """Each layout cuBLAS reads as it is, or after a copy, against NumPy in float64; the
    plain path and a recorded graph replayed on new values (the graph reads fixed buffers)."""
    import cupy

    rng = np.random.default_rng(13)
    a, b = rng.normal(size=sa), rng.normal(size=sb)
    da, db = _operand(gpu, a, la), _operand(gpu, b, lb)
    if la == "swapped":
        assert not da.flags.c_contiguous  # the test must really hand cuBLAS a transposed view
    out = gpu.matmul(da, db)
    assert type(out) is cupy.ndarray and out.flags.c_contiguous
    np.testing.assert_allclose(gpu.to_numpy(out), a @ b, rtol=1e-5, atol=1e-5)
    stream = cupy.cuda.Stream()
    with gpu.capture(stream) as graph:
        captured = gpu.matmul(da, db)
    a2, b2 = rng.normal(size=sa), rng.normal(size=sb)
    # new values written into the same buffers (through the views), then one replay
    da[...] = cupy.asarray(a2, dtype=np.float32)
    db[...] = cupy.asarray(b2, dtype=np.float32)
    graph[0].launch(stream=stream)
    stream.synchronize()
    np.testing.assert_allclose(gpu.to_numpy(captured), a2 @ b2, rtol=1e-5, atol=1e-5)


def test_matmul_rule_of_a_linear_over_sequences_is_one_gemm_each_way(gpu):
    """fused["matmul"] for x (B, T, C) @ W (C, C'): dW summed over every row in one GEMM,
    as the reference rule's batched product and sum give; other shapes decline."""
    rng = np.random.default_rng(14)
    x, w = rng.normal(size=(6, 10, 12)), rng.normal(size=(12, 7))
    up = rng.normal(size=(6, 10, 7))
    results = []
    for fused in (True, False):
        tape = Tape(gpu, fused=fused)
        vx, vw = tape.leaf(x), tape.leaf(w)
        loss = tape.sum(tape.mul(tape.matmul(vx, vw), tape.constant(up)))
        steps = list(tape.backward_steps(loss))
        grads = tape.gradients
        assert any(s.op == "matmul" and s.fused for s in steps) == fused
        results.append([gpu.to_numpy(grads[vx]), gpu.to_numpy(grads[vw])])
    np.testing.assert_allclose(results[0][0], up @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(results[0][1], np.einsum("btc,btd->cd", x, up), rtol=1e-5,
                               atol=1e-4)
    for f, r in zip(*results):
        np.testing.assert_allclose(f, r, rtol=1e-5, atol=1e-4)
    q = gpu.tensor(rng.normal(size=(2, 3, 4, 5)))
    assert gpu.fused["matmul"](gpu, q, q, q, gpu.tensor(rng.normal(size=(2, 3, 5, 4)))) is None

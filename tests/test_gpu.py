"""The GPU backend against the CPU: every gradient, every kernel, and a whole training run.

Finite differences prove the rules right on the CPU in float64; these tests prove the GPU runs
them faithfully in float32: the same inputs on both backends, the same gradients to float32
rounding. Each kernel of cupy.py is compared with NumPy or with the reference formula it
replaces. Skipped, with the reason, where CuPy sees no device.
"""

import numpy as np
import pytest

from smallem import CrossEntropy, Tape
from smallem.backends import get_backend, gpu_available
from smallem.gradcheck import CASES, compare_backends, tape_gradients

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]


@pytest.fixture(scope="module")
def gpu():
    return get_backend("gpu")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_gradients_on_gpu_match_cpu64(gpu, case):
    """Same inputs (gradcheck's), GPU float32 against CPU float64."""
    inputs = case.inputs(np.random.default_rng(0))
    out64, grads64, _ = tape_gradients(case.fn, inputs, backend="cpu64")
    out32, grads32, _ = tape_gradients(case.fn, inputs, backend=gpu)
    np.testing.assert_allclose(out32, out64, rtol=2e-5, atol=2e-5)
    for g32, g64 in zip(grads32, grads64):
        scale = max(1.0, float(np.abs(g64).max()))
        np.testing.assert_allclose(g32, g64, rtol=1e-4, atol=1e-5 * scale)


def test_scatter_add_with_many_repeated_rows_matches_numpy(gpu):
    rng = np.random.default_rng(1)
    rows = np.concatenate([rng.integers(0, 8, size=4000), np.full(96, 3)])  # ~500 hits per row
    values = rng.normal(size=(rows.size, 32))
    assert np.bincount(rows).max() > 100  # without repeats the test would prove nothing
    out = gpu.scatter_add_rows(gpu.tensor(values), gpu.indices(rows), 10)
    expected = np.zeros((10, 32))
    np.add.at(expected, rows, values)
    # atomics add in a varying order: equal to float32 rounding, not bit for bit
    np.testing.assert_allclose(gpu.to_numpy(out), expected, rtol=1e-4, atol=1e-3)
    assert np.all(gpu.to_numpy(out)[8:] == 0)  # rows never named stay zero


def test_scatter_add_keeps_trailing_shape_and_two_dim_rows(gpu):
    rng = np.random.default_rng(2)
    rows = rng.integers(0, 5, size=(6, 7))
    values = rng.normal(size=(6, 7, 3))
    out = gpu.scatter_add_rows(gpu.tensor(values), gpu.indices(rows), 5)
    expected = np.zeros((5, 3))
    np.add.at(expected, rows.reshape(-1), values.reshape(-1, 3))
    np.testing.assert_allclose(gpu.to_numpy(out), expected, rtol=1e-5, atol=1e-5)


def test_gather_rows_matches_numpy(gpu):
    rng = np.random.default_rng(3)
    table, rows = rng.normal(size=(257, 32)), rng.integers(0, 257, size=(256, 16))
    out = gpu.gather_rows(gpu.tensor(table), gpu.indices(rows))
    np.testing.assert_array_equal(gpu.to_numpy(out), table.astype(np.float32)[rows])


def test_cross_entropy_kernel_matches_rule_on_a_training_batch(gpu):
    """The fused kernels (kernels["cross_entropy"]) against operations.CrossEntropy's rule,
    on the shape of a training step, with logits large enough to overflow a naive exp."""
    rng = np.random.default_rng(4)
    logits, targets = 30 * rng.normal(size=(256, 257)), rng.integers(0, 257, size=256)
    assert "cross_entropy" in gpu.kernels
    results = []
    for use_kernels in (True, False):
        tape = Tape(gpu, use_kernels=use_kernels)
        x = tape.leaf(logits)
        loss = tape.mul(tape.apply(CrossEntropy(targets), [x]), 3.0)  # a grad other than 1
        results.append((gpu.item(loss.value), gpu.to_numpy(tape.backward(loss)[x])))
    assert np.isfinite(results[0][0])
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-6)


def test_fused_tanh_rule_matches_the_tape_rule(gpu):
    """rules["tanh"] (one launch) against tape.RULES["tanh"] (three), on a hidden layer."""
    assert "tanh" in gpu.rules
    x = np.random.default_rng(12).normal(size=(256, 512))
    grads = []
    for use_kernels in (True, False):
        tape = Tape(gpu, use_kernels=use_kernels)
        leaf = tape.leaf(x)
        loss = tape.sum(tape.mul(tape.tanh(leaf), tape.constant(np.cos(x))))
        grads.append(gpu.to_numpy(tape.backward(loss)[leaf]))
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6, atol=1e-7)


def adamw_reference(p, g, m, v, *, lr, beta1, beta2, eps, weight_decay, bc1, bc2):
    """The update as the article writes it, in float64."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - lr * ((m / bc1) / (np.sqrt(v / bc2) + eps) + weight_decay * p)
    return p, m, v


def test_fused_adamw_over_many_tensors_matches_the_formula(gpu):
    """One launch for every tensor (more than 8, so the launches are chunked), each with its
    own decay, over several steps; and the single-tensor step."""
    rng = np.random.default_rng(5)
    shapes = [(257, 32), (512,), (1,), (33, 7), (5,), (3, 3), (2,), (4, 4), (9,), (1, 1)]
    decays = [0.0, 0.1, 0.0, 0.1, 0.0, 0.1, 0.0, 0.1, 0.0, 0.1]
    host = [[rng.normal(size=s), np.zeros(s), np.zeros(s)] for s in shapes]
    dev = [[gpu.tensor(p), gpu.tensor(m), gpu.tensor(v)] for p, m, v in host]
    kw = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8)
    for t in range(1, 6):
        grads = [rng.normal(size=s) * 10 ** rng.uniform(-3, 1) for s in shapes]
        bc1, bc2 = 1 - 0.9 ** t, 1 - 0.999 ** t
        gpu.adamw_step_many([d[0] for d in dev], [gpu.tensor(g) for g in grads],
                            [d[1] for d in dev], [d[2] for d in dev], weight_decays=decays,
                            bias_correction1=bc1, bias_correction2=bc2, **kw)
        for h, g, wd in zip(host, grads, decays):
            h[:] = adamw_reference(*h[:1], g, *h[1:], weight_decay=wd, bc1=bc1, bc2=bc2, **kw)
    # float32 rounding: m can cancel down to ~1e-3 from gradients of ~10, so its error is
    # measured against the gradients' size; v (a sum of squares) and p keep relative accuracy
    for (p, m, v), (dp, dm, dv) in zip(host, dev):
        np.testing.assert_allclose(gpu.to_numpy(dm), m, rtol=1e-5, atol=1e-6 * 10)
        np.testing.assert_allclose(gpu.to_numpy(dv), v, rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(gpu.to_numpy(dp), p, rtol=1e-5, atol=1e-6)
    # the single-tensor entry point, first step: every element moves by lr (bias correction)
    p, g = gpu.tensor(np.zeros(100)), gpu.tensor(rng.normal(size=100) * 1e3)
    m, v = gpu.zeros((100,)), gpu.zeros((100,))
    gpu.adamw_step(p, g, m, v, weight_decay=0.0, bias_correction1=0.1, bias_correction2=0.001,
                   **kw)
    np.testing.assert_allclose(np.abs(gpu.to_numpy(p)), 1e-2, rtol=1e-5)


def test_fused_sgd_matches_the_formula(gpu):
    rng = np.random.default_rng(6)
    shapes = [(300, 7), (1,), (64,)]
    ps, gs = [rng.normal(size=s) for s in shapes], [rng.normal(size=s) for s in shapes]
    dev = [gpu.tensor(p) for p in ps]
    gpu.sgd_step_many(dev, [gpu.tensor(g) for g in gs], 0.1)
    gpu.sgd_step(dev[0], gpu.tensor(gs[0]), 0.1)
    for k, (p, g, d) in enumerate(zip(ps, gs, dev)):
        expected = p - 0.1 * g - (0.1 * g if k == 0 else 0)
        np.testing.assert_allclose(gpu.to_numpy(d), expected, rtol=1e-5, atol=1e-6)


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


@pytest.mark.parametrize("name", ["neg", "exp", "log", "sqrt", "tanh", "sigmoid", "relu",
                                  "square", "abs"])
def test_unary_fast_paths_match_numpy(gpu, name):
    x = np.random.default_rng(8).uniform(0.1, 3.0, size=(37, 11)) * np.array([1, -1] * 5 + [1])
    x = np.abs(x) if name in ("log", "sqrt") else x
    cpu = get_backend("cpu64")
    np.testing.assert_allclose(gpu.to_numpy(getattr(gpu, name)(gpu.tensor(x))),
                               getattr(cpu, name)(x), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_through_cublas_reads_transposed_views(gpu, ta, tb):
    rng = np.random.default_rng(9)
    a, b = rng.normal(size=(37, 19)), rng.normal(size=(19, 23))
    da = gpu.transpose(gpu.tensor(a.T.copy()), 0, 1) if ta else gpu.tensor(a)
    db = gpu.transpose(gpu.tensor(b.T.copy()), 0, 1) if tb else gpu.tensor(b)
    np.testing.assert_allclose(gpu.to_numpy(gpu.matmul(da, db)), a @ b, rtol=1e-5, atol=1e-5)


def test_sum_over_first_dim_matches_numpy(gpu):
    x = np.random.default_rng(10).normal(size=(1000, 3, 37))
    np.testing.assert_allclose(gpu.to_numpy(gpu.sum(gpu.tensor(x), 0)), x.sum(0), atol=1e-4)
    np.testing.assert_allclose(gpu.to_numpy(gpu.sum(gpu.tensor(x), 0, keepdim=True)),
                               x.sum(0, keepdims=True), atol=1e-4)


def test_index_uploads_through_the_pinned_ring_arrive_intact(gpu):
    """More uploads than the ring has buffers, of varying sizes, each checked after all."""
    rng = np.random.default_rng(11)
    hosts = [rng.integers(0, 1000, size=(int(rng.integers(1, 5000)),)) for _ in range(40)]
    devs = [gpu.indices(h) for h in hosts]
    for h, d in zip(hosts, devs):
        np.testing.assert_array_equal(gpu.to_numpy(d), h)


def test_cpu_and_gpu_training_losses_agree_at_step_500(gpu):
    """The third check of article 7: same seed, same initial weights, same batches; CPU and GPU
    losses equal to 4 decimals at step 500."""
    from smallem.checks import check_backends_agree

    result = check_backends_agree("cpu", "gpu", steps=500)
    print(result)
    assert result.passed and result.value < 5e-5, result
    assert result.expected.startswith("|difference| at step 500 ≤ 5e-05")


def test_compare_backends_passes_on_gpu(gpu):
    """What `smallem gradcheck --backend gpu` prints: every case within float32's tolerance."""
    results = compare_backends("gpu")
    assert len(results) == len(CASES) and all(r.passed for r in results), \
        [(r.name, r.max_error) for r in results if not r.passed]

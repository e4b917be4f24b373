"""The GPU backend against the CPU: every gradient, every kernel, and a whole training run.

Finite differences prove the rules right on the CPU in float64; these tests prove the GPU runs
them faithfully in float32: the same inputs on both backends, the same gradients to float32
rounding. Each kernel of cupy.py is compared with NumPy or with the reference formula it
replaces. Skipped, with the reason, where CuPy sees no device.
"""

import numpy as np
import pytest

from smallem import CrossEntropy, Tape
from smallem.autodiff.gradcheck import CASES, compare_backends, tape_gradients
from smallem.backends import get_backend, gpu_available
from smallem.backends.cuda.elementwise import UNARY

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


def test_the_backends_fused_tables_are_the_kernel_rooms(gpu):
    """cupy.py registers nothing by hand: its tables are backends/cuda's, entry for entry."""
    from smallem.backends import cuda

    assert gpu.fused == cuda.FUSED and gpu.fused_forward == cuda.FUSED_FORWARD
    assert set(cuda.fused_names()) == set(gpu.fused) | set(gpu.fused_forward)


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
    """The fused kernels (fused["cross_entropy"] and its forward) against
    operations.CrossEntropy's rule, on the shape of a training step, with logits large enough
    to overflow a naive exp."""
    rng = np.random.default_rng(4)
    logits, targets = 30 * rng.normal(size=(256, 257)), rng.integers(0, 257, size=256)
    assert "cross_entropy" in gpu.fused and "cross_entropy" in gpu.fused_forward
    results = []
    for fused in (True, False):
        tape = Tape(gpu, fused=fused)
        x = tape.leaf(logits)
        loss = tape.mul(tape.apply(CrossEntropy(targets), [x]), 3.0)  # a grad other than 1
        results.append((gpu.item(loss.value), gpu.to_numpy(tape.backward(loss)[x])))
    assert np.isfinite(results[0][0])
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-6)


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
    from smallem.training.checks import check_backends_agree

    result = check_backends_agree("cpu", "gpu", steps=500)
    print(result)
    assert result.passed and result.value < 5e-5, result
    assert result.expected.startswith("|difference| at step 500 ≤ 5e-05")


def test_compare_backends_passes_on_gpu(gpu):
    """What `smallem gradcheck --backend gpu` prints: every case within float32's tolerance."""
    results = compare_backends("gpu")
    assert len(results) == len(CASES) and all(r.passed for r in results), \
        [(r.name, r.max_error) for r in results if not r.passed]


# the captured step (step.CapturedStep) -----------------------------------------------------------
def _runs(gpu, steps, *, capture, optimizer="adamw", batch=64, seed=0, observer_every=0):
    """Losses of `steps` training steps of the MLP from seed 0, plain or captured."""
    from smallem.data import BatchSampler, load_corpus
    from smallem.models.mlp import Mlp
    from smallem.optim import make_optimizer
    from smallem.training.config import TrainConfig
    from smallem.training.step import make_step

    corpus = load_corpus(max_bytes=400_000)
    model = Mlp(backend=gpu, seed=seed)
    opt = make_optimizer(optimizer, TrainConfig(optimizer=optimizer).learning_rate)  # the MLP's
    step = make_step(gpu, model, opt, capture=capture)
    sampler = BatchSampler(corpus.train, batch, 16, seed=[seed, 1])
    losses = []
    for k in range(steps):
        watch = _Watch() if observer_every and (k + 1) % observer_every == 0 else None
        losses.append(gpu.item(step(*sampler.next(), observer=watch)))
        if watch is not None:
            assert watch.looked  # the observed step ran plain, and saw the tape
    return np.array(losses), model, opt, step


class _Watch:
    looked = False

    def after_backward(self, tape, loss, grads):
        self.looked = len(tape) > 0

    def after_update(self):
        pass


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_captured_steps_give_the_plain_steps_losses(gpu, optimizer):
    """Same kernels, same order: 300 replayed steps as close to the plain ones as two plain
    runs are to each other (the atomics of the embedding's scatter-add add in a varying order,
    so not bit for bit; SGD at lr 0.5 amplifies that the most), and the graph really replays."""
    plain, _, opt_plain, _ = _runs(gpu, 300, capture=False, optimizer=optimizer)
    again, *_ = _runs(gpu, 300, capture=False, optimizer=optimizer)
    captured, _, opt_captured, step = _runs(gpu, 300, capture=True, optimizer=optimizer)
    assert step.graph is not None and step.replays == 298 and step.failed is None
    noise = float(np.abs(again - plain).max())
    print(f"{optimizer}: plain vs plain {noise:.2e}, captured vs plain "
          f"{float(np.abs(captured - plain).max()):.2e}")
    np.testing.assert_allclose(captured, plain, atol=max(1e-5, 4 * noise))
    assert opt_captured.steps == opt_plain.steps == 300


def test_bias_correction_advances_across_replays(gpu):
    """AdamW's bias corrections are read from device memory at each replay: were they frozen
    into the graph, every replay would repeat step 2's and the parameters would part at once."""
    _, model_p, opt_p, _ = _runs(gpu, 40, capture=False)
    _, model_c, opt_c, _ = _runs(gpu, 40, capture=True)
    assert set(opt_c.t.values()) == {40}
    for p, q in zip(model_p.parameters(), model_c.parameters()):
        np.testing.assert_allclose(q.numpy(), p.numpy(), atol=2e-5)


def test_what_cannot_be_captured_runs_plain(gpu):
    """An observed step, a clipping optimizer, another batch shape: the plain path, same
    numbers; the graph stays and replays again afterwards."""
    plain, *_ = _runs(gpu, 60, capture=False)
    observed, _, _, step = _runs(gpu, 60, capture=True, observer_every=7)
    np.testing.assert_allclose(observed, plain, atol=1e-5)
    assert step.graph is not None and step.replays == 60 - 2 - 60 // 7
    from smallem.models.mlp import Mlp
    from smallem.optim import AdamW
    from smallem.training.step import CapturedStep

    clipped = CapturedStep(gpu, Mlp(backend=gpu), AdamW(max_norm=1.0))
    batch = (np.zeros((8, 16), np.int64), np.ones(8, np.int64))
    for _ in range(3):
        clipped(*batch)
    assert clipped.graph is None
    other = CapturedStep(gpu, Mlp(backend=gpu), AdamW())
    for _ in range(3):
        other(*batch)
    assert other.graph is not None and other.replays == 1
    other(np.zeros((4, 16), np.int64), np.ones(4, np.int64))  # another shape: plain
    assert other.replays == 1


def test_a_bad_batch_is_refused_before_its_upload(gpu):
    from smallem import SmallemError
    from smallem.models.mlp import Mlp
    from smallem.optim import AdamW
    from smallem.training.step import CapturedStep

    step = CapturedStep(gpu, Mlp(backend=gpu), AdamW())
    good = (np.zeros((8, 16), np.int64), np.ones(8, np.int64))
    step(*good)
    step(*good)
    with pytest.raises(SmallemError, match=r"targets must be integers in \[0, 257\)"):
        step(good[0], np.full(8, 300, np.int64))


def test_a_captured_run_resumes_from_its_checkpoint(gpu, tmp_path):
    """120 captured steps saved at 60, resumed to 120: the same losses as without the stop,
    to the atomics' rounding."""
    from smallem.data import load_corpus
    from smallem.models.mlp import MlpConfig
    from smallem.training.config import TrainConfig
    from smallem.training.loop import train

    corpus = load_corpus(max_bytes=400_000)
    base = dict(backend="gpu", batch=64, log_every=20, eval_every=60, eval_batches=2,
                save_every=0, sizes=MlpConfig(context=16, embed=8, hidden=64))
    whole = train(TrainConfig(steps=120, **base), corpus=corpus, progress=False, log=None)
    path = tmp_path / "half.npz"
    train(TrainConfig(steps=60, **base), corpus=corpus, progress=False, log=None, save=path)
    rest = train(TrainConfig(steps=120, **base), corpus=corpus, progress=False, log=None,
                 resume=path)
    a = [r["train_loss"] for r in whole.history if r["train_loss"] is not None]
    b = [r["train_loss"] for r in rest.history if r["train_loss"] is not None]
    np.testing.assert_allclose(b, a, atol=1e-5)
    assert rest.optimizer.steps == 120 and set(rest.optimizer.t.values()) == {120}


# batched products (cuda/gemm.py) ------------------------------------------------------------------
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


SOFTMAX_SHAPES = [(4, 2, 16, 16), (3, 64, 64), (2, 1, 1), (5, 70, 70), (7, 33), (1, 3, 40, 40)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
def test_fused_softmax_matches_its_reference_rule(gpu, shape, causal):
    """One kernel each way, against operations.Softmax's forward and rule in float64; masked
    weights and their gradients exactly 0; rows with one allowed entry (the first query) and
    scores of ±30 (a naive exp would overflow float32 beyond ±88) included."""
    Softmax = _softmax_op()
    if causal and (len(shape) < 2 or shape[-1] != shape[-2]):
        pytest.skip("a causal mask needs square (T, T) blocks")
    x = 30 * np.random.default_rng(16).normal(size=shape)
    fused, ref = _fused_vs_reference(gpu, lambda t, v: t.apply(Softmax(causal=causal), [v]),
                                        [x])
    assert fused[2]["softmax"] and not ref[2]["softmax"]
    _close(fused[0], ref[0], 1e-5)
    _close(fused[1][0], ref[1][0], 1e-4)
    if causal:
        n = shape[-1]
        masked = np.broadcast_to(np.triu(np.ones((n, n), bool), 1), shape)
        assert np.all(fused[0][masked] == 0) and np.all(fused[1][0][masked] == 0)
        np.testing.assert_allclose(fused[0].sum(-1), 1.0, rtol=1e-5)


def test_fused_softmax_declines_what_it_cannot_take(gpu):
    Softmax = _softmax_op()
    x = gpu.tensor(np.random.default_rng(17).normal(size=(4, 8, 16)))
    strided = x[:, :, ::2]
    assert gpu.fused_forward["softmax"](gpu, strided, Softmax(causal=False)) is None
    assert gpu.fused_forward["softmax"](gpu, x, Softmax(causal=True)) is None  # not square
    assert gpu.fused["softmax"](gpu, strided, strided, strided, Softmax(causal=False)) is None
    assert gpu.fused_forward["softmax"](gpu, x.astype(np.float64), Softmax(causal=False)) is None


@pytest.mark.parametrize("shape", [(64, 64, 128), (5, 7), (3, 1), (2, 3, 200), (1, 33)], ids=str)
def test_fused_layer_norm_matches_its_reference_rule(gpu, shape):
    """Forward in one launch; rule in two (dx, then dw and db as one column sum)."""
    from smallem.autodiff.operations import LayerNorm

    rng = np.random.default_rng(18)
    c = shape[-1]
    x = 3 + 2 * rng.normal(size=shape)  # an offset: the mean must really be taken out
    w, b = 1 + 0.3 * rng.normal(size=c), 0.1 * rng.normal(size=c)
    fused, ref = _fused_vs_reference(gpu, lambda t, *v: t.apply(LayerNorm(), list(v)),
                                        [x, w, b])
    assert fused[2]["layer_norm"] and not ref[2]["layer_norm"]
    _close(fused[0], ref[0], 2e-5)
    for got, want in zip(fused[1], ref[1]):
        _close(got, want, 1e-4)


def test_fused_layer_norm_declines_what_it_cannot_take(gpu):
    from smallem.autodiff.operations import LayerNorm

    x = gpu.tensor(np.random.default_rng(19).normal(size=(6, 16)))
    w, b = gpu.tensor(np.ones(8)), gpu.tensor(np.zeros(8))
    assert gpu.fused_forward["layer_norm"](gpu, x[:, ::2], w, b, LayerNorm()) is None
    assert gpu.fused["layer_norm"](gpu, x[:, ::2], x[:, ::2], x[:, ::2], w, b,
                                   LayerNorm()) is None


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


def test_cross_entropy_over_many_rows_matches_the_rule(gpu):
    """A Transformer's loss: B·T = 4096 rows, above MANY_ROWS, where the forward takes a warp
    per row and a fixed-order mean instead of one block."""
    from smallem.backends.cuda.cross_entropy import MANY_ROWS

    rng = np.random.default_rng(21)
    logits, targets = 20 * rng.normal(size=(64, 64, 257)), rng.integers(0, 257, size=(64, 64))
    assert targets.size > MANY_ROWS
    values = []
    for fused in (True, False):
        tape = Tape(gpu, fused=fused)
        values.append(gpu.item(tape.apply(CrossEntropy(targets), [tape.leaf(logits)]).value))
    z = logits - logits.max(-1, keepdims=True)
    exact = float(np.mean(np.log(np.exp(z).sum(-1)) - np.take_along_axis(
        z, targets[..., None], -1)[..., 0]))
    assert values[0] == pytest.approx(exact, rel=1e-5)
    assert values[1] == pytest.approx(exact, rel=1e-5)


def test_host_constants_met_while_recording_are_filled_once(gpu):
    """Position indices and a constant made from host data inside a capture (what a
    Transformer's forward does): device buffers of the graph, filled when the recording ends,
    read by every replay however many uploads the pinned ring makes in between."""
    import cupy

    rng = np.random.default_rng(22)
    host = rng.normal(size=(10, 4))
    table = gpu.tensor(host)
    stream = cupy.cuda.Stream()
    with gpu.capture(stream) as graph:
        rows = gpu.indices(np.array([3, 1, 4]))
        out = gpu.mul(gpu.gather_rows(table, rows), gpu.tensor(np.full((3, 4), 2.0)))
        again = gpu.indices(np.array([3, 1, 4]))  # the same data: the same buffer
    assert again is rows and len(graph) == 3
    for k in range(3):
        for _ in range(12):  # more uploads than the ring has buffers
            gpu.indices(rng.integers(0, 10, size=5))
        host = rng.normal(size=(10, 4))
        table[...] = cupy.asarray(host, dtype=np.float32)
        graph[0].launch(stream=stream)
        stream.synchronize()
        np.testing.assert_allclose(gpu.to_numpy(out), 2 * host[[3, 1, 4]], rtol=1e-6)


# the captured Transformer step ----------------------------------------------------------------
def _transformer_runs(gpu, steps, *, capture, batch=16, observer_every=0, optimizer=None):
    """Losses of `steps` steps of the default Transformer (seed 0) at batch `batch`."""
    from smallem.data import load_corpus
    from smallem.optim import make_optimizer
    from smallem.tools.bench import build, sequence_batches
    from smallem.training.step import make_step

    corpus = load_corpus(max_bytes=400_000)
    model = build("transformer", gpu, 0)
    opt = optimizer or make_optimizer("adamw")
    step = make_step(gpu, model, opt, capture=capture)
    batches = sequence_batches(corpus.train, batch, model.config.context, steps, seed=3)
    losses = []
    for k, b in enumerate(batches):
        watch = _Watch() if observer_every and (k + 1) % observer_every == 0 else None
        losses.append(gpu.item(step(*b, observer=watch)))
        if watch is not None:
            assert watch.looked
    return np.array(losses), model, opt, step


def test_captured_transformer_steps_give_the_plain_steps_losses(gpu):
    """60 replayed steps as close to the plain ones as two plain runs are (the token
    embedding's scatter-add adds atomically, in a varying order), and the graph replays."""
    plain, model_p, opt_p, _ = _transformer_runs(gpu, 60, capture=False)
    again, *_ = _transformer_runs(gpu, 60, capture=False)
    captured, model_c, opt_c, step = _transformer_runs(gpu, 60, capture=True)
    assert step.failed is None and step.graph is not None and step.replays == 58
    noise = float(np.abs(again - plain).max())
    print(f"transformer: plain vs plain {noise:.2e}, captured vs plain "
          f"{float(np.abs(captured - plain).max()):.2e}")
    np.testing.assert_allclose(captured, plain, atol=max(2e-5, 4 * noise))
    assert opt_c.steps == opt_p.steps == 60 and set(opt_c.t.values()) == {60}
    for p, q in zip(model_p.parameters(), model_c.parameters()):
        np.testing.assert_allclose(q.numpy(), p.numpy(), atol=max(1e-4, 40 * noise))


def test_what_cannot_be_captured_in_a_transformer_step_runs_plain(gpu):
    """An observed step runs plain (same numbers), another batch shape runs plain and the
    graph replays again afterwards; a clipping optimizer never captures."""
    from smallem.optim import AdamW
    from smallem.tools.bench import build
    from smallem.training.step import CapturedStep

    plain, *_ = _transformer_runs(gpu, 20, capture=False)
    observed, _, _, step = _transformer_runs(gpu, 20, capture=True, observer_every=6)
    np.testing.assert_allclose(observed, plain, atol=2e-5)
    assert step.graph is not None and step.replays == 20 - 2 - 20 // 6
    t = build("transformer", gpu, 0).config.context
    batch = (np.zeros((4, t), np.int64), np.ones((4, t), np.int64))
    clipped = CapturedStep(gpu, build("transformer", gpu, 0), AdamW(max_norm=1.0))
    for _ in range(3):
        clipped(*batch)
    assert clipped.graph is None
    other = CapturedStep(gpu, build("transformer", gpu, 0), AdamW())
    for _ in range(3):
        other(*batch)
    assert other.graph is not None and other.replays == 1
    other(np.zeros((2, t), np.int64), np.ones((2, t), np.int64))  # another shape: plain
    assert other.replays == 1
    other(*batch)
    assert other.replays == 2


def test_a_failed_transformer_capture_restores_the_counts_and_trains_on_plain(gpu):
    """An optimizer that reads the device while the step is recorded (after its bookkeeping
    advanced the step counts): the capture fails, the counts are put back, a warning says so,
    and training goes on with the plain step, the same numbers."""
    from smallem.optim import AdamW

    class ReadsTheDevice(AdamW):
        def step(self, parameters, grads):
            super().step(parameters, grads)
            backend = parameters[0].backend
            if backend.capturing:
                backend.item(backend.full((), 1.0))  # a device-to-host copy: not recordable

    with pytest.warns(RuntimeWarning, match="could not be captured"):
        failed, _, opt, step = _transformer_runs(gpu, 12, capture=True,
                                                 optimizer=ReadsTheDevice())
    plain, *_ = _transformer_runs(gpu, 12, capture=False)
    assert step.failed and step.graph is None
    assert opt.steps == 12 and set(opt.t.values()) == {12}
    np.testing.assert_allclose(failed, plain, atol=2e-5)


@pytest.mark.parametrize("sdpa", [False, True])
def test_torch_transformer_reference_is_the_same_model(gpu, sdpa):
    """bench's PyTorch Transformer, from the same weights and batch, gives smallem's loss and
    the same loss after three AdamW steps: the bench times one model, not two."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    from smallem.data import load_corpus
    from smallem.optim import ADAMW_LR, ADAMW_WEIGHT_DECAY, AdamW
    from smallem.tools.bench import build, sequence_batches
    from smallem.tools.bench_reference import TorchTransformer
    from smallem.training.step import make_step

    model = build("transformer", gpu, 0)
    ref = TorchTransformer(build("transformer", "cpu64", 0), "cuda", lr=ADAMW_LR,
                           weight_decay=ADAMW_WEIGHT_DECAY, sdpa=sdpa)
    step = make_step(gpu, model, AdamW(lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY),
                     capture=False)
    batches = sequence_batches(load_corpus(max_bytes=400_000).train, 8, model.config.context, 4,
                               seed=4)
    ours = [gpu.item(step(*b)) for b in batches]
    theirs = [float(ref.step(*b).item()) for b in batches]
    assert abs(ours[0] - np.log(257)) < 0.1
    np.testing.assert_allclose(ours, theirs, rtol=2e-4)


# the Transformer (lessons 11-12) ---------------------------------------------------------------
def _transformer_batch(seed=0):
    from smallem.models import TransformerConfig

    config = TransformerConfig(layers=2, width=64, heads=4, context=32)
    rng = np.random.default_rng(seed)
    return config, rng.integers(0, 257, size=(8, 32)), rng.integers(0, 257, size=(8, 32))


def test_transformer_gpu_gradients_match_cpu64_per_parameter(gpu):
    """The same weights and batch on the GPU (float32) and on cpu64: the loss to float32
    rounding, each parameter's gradient within 1e-3 of its largest entry (the key bias's true
    gradient is 0: it is measured against the model's largest gradient instead)."""
    from smallem.models import Transformer

    config, x, y = _transformer_batch()
    results = {}
    for name in ("cpu64", "gpu"):
        model = Transformer(config, backend=name, seed=3)
        tape = Tape(name)
        loss = model.loss(tape, x, y)
        grads = tape.backward(loss)
        be = get_backend(name)
        results[name] = (be.item(tape.value(loss)),
                         {n: np.asarray(be.to_numpy(p.grad(grads)), np.float64)
                          for n, p in model.named_parameters()})
    (loss64, g64), (loss32, g32) = results["cpu64"], results["gpu"]
    assert abs(loss32 - loss64) < 1e-5 * loss64
    largest = max(np.abs(g).max() for g in g64.values())
    for name, want in g64.items():
        scale = max(np.abs(want).max(), 1e-3 * largest)
        assert np.abs(g32[name] - want).max() / scale < 1e-3, name


def test_transformer_gpu_softmax_masks_exactly(gpu):
    tape = Tape(gpu)
    from smallem import softmax

    x = tape.leaf(np.random.default_rng(1).normal(size=(2, 4, 16, 16)))
    s = softmax(tape, x, causal=True)
    grads = tape.backward(s, grad=np.random.default_rng(2).normal(size=(2, 4, 16, 16)))
    upper = np.triu(np.ones((16, 16), bool), k=1)
    assert np.all(gpu.to_numpy(s.value)[..., upper] == 0.0)
    assert np.all(gpu.to_numpy(grads[x])[..., upper] == 0.0)


def test_transformer_plain_gpu_training_follows_the_cpu(gpu):
    """40 plain (uncaptured) GPU steps of a small Transformer: the loss falls, and follows the
    float32 CPU run on the same seeded weights and batches."""
    from smallem.data import load_corpus
    from smallem.models import TransformerConfig
    from smallem.training.config import TrainConfig
    from smallem.training.loop import train

    corpus = load_corpus(max_bytes=400_000)
    base = dict(model="transformer", steps=40, batch=16, log_every=10, eval_every=40,
                eval_batches=2, save_every=0, capture=False,
                sizes=TransformerConfig(layers=2, width=64, heads=4, context=32))
    runs = {name: train(TrainConfig(backend=name, **base), corpus=corpus, progress=False,
                        log=None) for name in ("gpu", "cpu")}
    losses = {n: [r["train_loss"] for r in run.history if r["train_loss"] is not None]
              for n, run in runs.items()}
    assert losses["gpu"][-1] < runs["gpu"].initial_loss - 1.0
    np.testing.assert_allclose(losses["gpu"], losses["cpu"], atol=2e-3)
    assert abs(runs["gpu"].held_out_loss - runs["cpu"].held_out_loss) < 2e-3

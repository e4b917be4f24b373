"""Every gradient rule on the GPU in float32 against cpu64 (gradcheck's cases, the Transformer
parameter by parameter), and training runs that follow the CPU's.
Skipped, with the reason, where CuPy sees no device."""

import numpy as np
import pytest

from smallem import Tape
from smallem.autodiff.gradcheck import CASES, compare_backends, tape_gradients
from smallem.backends import get_backend, gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]


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
    """cupy.py registers nothing by hand: its tables are backends/cuda's, entry for entry, less
    the entries its switches turn off (cuda.switched_off(): none by default)."""
    from smallem.backends import cuda

    off = cuda.switched_off()
    assert gpu.fused == {k: v for k, v in cuda.FUSED.items() if k not in off}
    assert gpu.fused_forward == {k: v for k, v in cuda.FUSED_FORWARD.items() if k not in off}
    assert set(cuda.fused_names()) == set(gpu.fused) | set(gpu.fused_forward) | off


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

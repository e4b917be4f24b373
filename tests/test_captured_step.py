"""The captured step's contract (training/step.py): what it needs of an optimizer, declared once
(CapturableOptimizer) and met by SGD and AdamW; and a returned loss that stays what it was when
the step returned. The CPU tests check the logic; the GPU tests run the graph.
"""

import numpy as np
import pytest

from smallem import Tape
from smallem.backends import get_backend, gpu_available
from smallem.models.mlp import Mlp, MlpConfig
from smallem.optim import SGD, AdamW
from smallem.training.step import CapturableOptimizer, CapturedStep, fresh_copy, make_step


def _trained(optimizer, steps=3):
    model = Mlp(MlpConfig(context=4, embed=3, hidden=8), backend="cpu64", seed=0)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        tape = Tape("cpu64")
        loss = model.loss(tape, rng.integers(0, 257, (5, 4)), rng.integers(0, 257, 5))
        optimizer.step(model.parameters(), tape.backward(loss))
    return model


@pytest.mark.parametrize("make", [lambda: SGD(0.1), AdamW])
def test_the_optimizers_meet_the_capture_contract(make):
    assert isinstance(make(), CapturableOptimizer)


def test_an_optimizer_without_the_contract_is_never_captured():
    """make_step hands it the plain step, even on a GPU backend (no CuPy needed to decide)."""
    class OnlySteps:
        lr, max_norm, steps = 0.1, None, 0

        def step(self, parameters, gradients):
            pass

    class NamedGpu:
        name = "gpu"

    assert not isinstance(OnlySteps(), CapturableOptimizer)
    step = make_step(NamedGpu(), Mlp(backend="cpu64"), OnlySteps())
    assert not isinstance(step, CapturedStep) and callable(step)


@pytest.mark.parametrize("make", [lambda: SGD(0.1), AdamW])
def test_snapshot_and_restore_put_the_host_counters_back(make):
    optimizer = make()
    model = _trained(optimizer)
    before = optimizer.snapshot()
    state = optimizer.state_dict(model.named_parameters())["meta"]
    optimizer.count_step(model.parameters())  # what a failed recording leaves behind
    assert optimizer.steps == 4
    optimizer.restore(before)
    assert optimizer.state_dict(model.named_parameters())["meta"] == state
    assert optimizer.steps == 3


def test_adamw_writes_each_parameters_bias_corrections_for_the_replay():
    optimizer = AdamW(betas=(0.8, 0.99))
    model = _trained(optimizer, steps=2)
    params = model.parameters()
    assert optimizer.corrections_per_parameter == 2
    out = np.full(2 * len(params), np.nan, np.float32)
    optimizer.write_corrections(params, out)
    np.testing.assert_allclose(out, np.tile([1 - 0.8 ** 2, 1 - 0.99 ** 2], len(params)),
                               rtol=1e-6)
    assert SGD(0.1).corrections_per_parameter == 0


def test_adamw_reads_device_corrections_only_inside_the_block(monkeypatch):
    """Inside reading_corrections(device) the update is told to read them from `device`; after
    it (also when the block fails), from its own arguments again."""
    optimizer = AdamW()
    model = _trained(optimizer, steps=1)
    be = get_backend("cpu64")
    seen = []
    real = be.adamw_update

    def spy(*args, corrections=None, **kwargs):
        seen.append(corrections)
        real(*args, **kwargs)

    monkeypatch.setattr(be, "adamw_update", spy)

    def one_step():
        tape = Tape("cpu64")
        loss = model.loss(tape, np.zeros((2, 4), np.int64), np.ones(2, np.int64))
        optimizer.step(model.parameters(), tape.backward(loss))

    marker = object()
    with pytest.raises(KeyError):
        with optimizer.reading_corrections(marker):
            one_step()
            raise KeyError("a capture that fails")
    one_step()
    assert seen == [marker, None]


class _FakeCupy:
    """Enough of cupy for fresh_copy: arrays with a device pointer, and the copies queued."""

    class ndarray:
        count = 0

        def __init__(self, shape, dtype):
            _FakeCupy.ndarray.count += 1
            self.shape, self.dtype = shape, np.dtype(dtype)
            self.nbytes = self.dtype.itemsize * int(np.prod(shape))
            self.data = type("Pointer", (), {"ptr": 1000 * _FakeCupy.ndarray.count})()

    class cuda:
        class runtime:
            memcpyDeviceToDevice = 3
            copies: list = []

            @staticmethod
            def memcpyAsync(dst, src, size, kind, stream):
                _FakeCupy.cuda.runtime.copies.append((dst, src, size, kind, stream))


def test_each_returned_loss_is_a_new_array_copied_from_the_graphs_on_its_stream():
    fake = _FakeCupy
    loss = fake.ndarray((), np.float32)
    stream = type("Stream", (), {"ptr": 77})()
    outs = [fresh_copy(fake, loss, stream) for _ in range(3)]
    assert len({id(o) for o in outs}) == 3 and all(o is not loss for o in outs)
    assert all(o.shape == () and o.dtype == np.float32 for o in outs)
    assert fake.cuda.runtime.copies == [(o.data.ptr, loss.data.ptr, 4, 3, 77) for o in outs]


# on the GPU ----------------------------------------------------------------------------------
def _losses(model_name, *, capture, steps=50):
    """The step's returned objects over `steps` steps, unread until the end, and the plain
    reading of each right after its step."""
    from smallem.data import SequenceSampler, load_corpus
    from smallem.models import Transformer, TransformerConfig
    from smallem.optim import make_optimizer

    gpu = get_backend("gpu")
    corpus = load_corpus(max_bytes=400_000)
    model = (Transformer(TransformerConfig(), gpu, seed=0) if model_name == "transformer"
             else Mlp(MlpConfig(), gpu, seed=0))
    step = make_step(gpu, model, make_optimizer("adamw"), capture=capture)
    if model_name == "transformer":
        sampler = SequenceSampler(corpus.train, 8, model.config.context, seed=3)
        batches = [sampler.next() for _ in range(steps)]
    else:
        rng = np.random.default_rng(3)
        t = model.config.context
        starts = rng.integers(0, corpus.train.size - t - 1, size=(steps, 64))
        windows = corpus.train[starts[..., None] + np.arange(t + 1)]
        batches = [(w[:, :t], w[:, t]) for w in windows]
    kept, read_at_once = [], []
    for b in batches:
        kept.append(step(*b))
        read_at_once.append(gpu.item(kept[-1]))
    return kept, np.array(read_at_once), step


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")
@pytest.mark.parametrize("model_name", ["mlp", "transformer"])
def test_every_returned_loss_is_kept_over_50_captured_steps(model_name):
    """losses.append(step(x, y)) over 50 steps, read after the loop: each object its own, each
    value the one read when its step returned, and the plain step's losses (to the rounding of
    the embedding's atomic scatter-add, as two plain runs differ)."""
    gpu = get_backend("gpu")
    kept, at_once, step = _losses(model_name, capture=True)
    assert step.graph is not None and step.replays == 48 and step.failed is None
    assert len({id(x) for x in kept}) == 50
    after = np.array([gpu.item(x) for x in kept])
    np.testing.assert_array_equal(after, at_once)
    assert len(np.unique(after)) > 45  # the losses really differ from step to step
    plain, plain_at_once, _ = _losses(model_name, capture=False)
    again = _losses(model_name, capture=False)[1]
    noise = float(np.abs(again - plain_at_once).max())
    np.testing.assert_allclose(after, plain_at_once, rtol=0, atol=max(2e-5, 4 * noise))


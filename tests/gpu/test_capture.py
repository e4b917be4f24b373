"""The captured step (training/step.py's CapturedStep) on the GPU: replayed losses equal the plain
ones, what cannot be captured runs plain, host constants, resume, the Transformer's step.
Skipped, with the reason, where CuPy sees no device."""

import numpy as np
import pytest

from smallem.backends import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]


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

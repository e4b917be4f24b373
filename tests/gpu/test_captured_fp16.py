"""fp16 captured: the loss scaler's rule on the device (backends/cuda/scaler.py, training/scaled.py)
against the CPU's LossScaler bit for bit, and a captured fp16 run against the plain one."""

import numpy as np
import pytest

from smallem.backends import get_backend, gpu_available
from smallem.backends.precision import LossScaler

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]


def test_the_device_scaler_follows_loss_scaler_step_for_step():
    """Skip and halve, count and double after `interval` clean steps: 200 random verdicts, from
    a scale that is no power of two, each read back and compared with the host's rule, with
    the gate the updates read and each parameter's 1 − βᵗ (t advancing on applied steps only)."""
    import cupy

    from smallem.backends.cuda.scaler import DeviceScaler

    be = get_backend("gpu", "fp16")
    host = LossScaler(scale=1000.0, interval=3)
    dev = DeviceScaler(params=2)
    dev.push(host.scale, host.clean, host.skipped, [5, 0])
    t = np.array([5, 0])
    rng = np.random.default_rng(0)
    clean = be.tensor(rng.normal(size=(40, 3)))
    for k, finite in enumerate(rng.random(200) < 0.7):
        bad = clean.copy()
        if not finite:
            bad[rng.integers(40), rng.integers(3)] = [np.inf, -np.inf, np.nan][k % 3]
        used = host.scale
        dev.check([be.tensor(np.ones(7)), bad])
        dev.decide(host.interval, 0.9, 0.999)
        applied = host.update(bool(finite))
        assert dev.pull() == (host.scale, host.clean, host.skipped), k
        gate = cupy.asnumpy(dev.gate)
        assert gate[0] == float(applied) and gate[1] == np.float32(1.0 / used)
        assert float(dev.seed) == np.float32(host.scale)
        t += applied
        if applied:
            want = np.stack([1.0 - 0.9 ** t, 1.0 - 0.999 ** t], 1).astype(np.float32).reshape(-1)
            np.testing.assert_array_equal(cupy.asnumpy(dev.corrections), want)
    assert host.skipped > 30 and host.scale != 1000.0  # both branches ran, many times


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_captured_fp16_run_is_the_plain_one(optimizer):
    """From a scale of 2^40 the first steps overflow and are skipped (the graph decides it),
    then the scale doubles every 3 clean steps: the same losses, weights, scaler and step counts
    as the plain step, which reads every verdict on the host."""
    from smallem.models.mlp import Mlp, MlpConfig
    from smallem.optim import SGD, AdamW
    from smallem.training.step import CapturedStep, make_step

    def run(capture):
        be = get_backend("gpu", "fp16")
        model = Mlp(MlpConfig(), be, seed=0)
        opt = AdamW(lr=1e-3) if optimizer == "adamw" else SGD(0.1)
        scaler = LossScaler(scale=2.0 ** 40, interval=3)
        step = make_step(be, model, opt, capture=capture, scaler=scaler)
        assert isinstance(step, CapturedStep) == capture
        rng = np.random.default_rng(1)
        losses = [step(rng.integers(0, 257, (256, 16)), rng.integers(0, 257, 256))
                  for _ in range(60)]
        meta = opt.state_dict(model.named_parameters())["meta"]  # settles the device's state
        return [float(x) for x in losses], model, meta, scaler, step

    plain_losses, plain, plain_meta, plain_scaler, _ = run(False)
    losses, model, meta, scaler, step = run(True)
    # Plain until the first applied update (its optimizer state is made outside the graph):
    # the calls before the recording skipped all but the last; the rest replayed the graph,
    # which skipped steps of its own when the growing scale overflowed again.
    plain_calls = 60 - 1 - step.replays
    assert step.graph is not None and step.replays > 30  # 42 on the H200
    assert scaler.skipped - (plain_calls - 1) > 0  # skips the graph decided
    assert plain_scaler.skipped > 5 and plain_scaler.scale > 2.0 ** 10  # skips, then growth
    assert (scaler.scale, scaler.clean, scaler.skipped) == \
        (plain_scaler.scale, plain_scaler.clean, plain_scaler.skipped)
    assert meta == plain_meta  # the scaler and every count, as a checkpoint keeps them
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    # SGD's weights follow its gradients' rounding linearly: equal to float32 rounding. AdamW
    # divides each gradient by its own running size, so a product summed in another order by
    # the graph's cuBLAS kernels moves a weight whose gradient is near zero by a fraction of lr
    # (8.7e-7 = 8.7e-4 lr measured on the H200); a step skipped or applied twice moves every
    # weight by about lr: the bound sits a hundred times below that.
    bound = dict(rtol=1e-5, atol=1e-7) if optimizer == "sgd" else dict(rtol=0, atol=1e-2 * 1e-3)
    for (name, p), (_, q) in zip(plain.named_parameters(), model.named_parameters()):
        np.testing.assert_allclose(q.numpy(), p.numpy(), err_msg=name, **bound)


@pytest.mark.parametrize("bad", [None, np.inf, -np.inf, np.nan])
def test_the_plain_steps_verdict_on_the_gpu_is_the_generic_one(bad):
    """precision.all_finite on the GPU takes the finite-check kernels (one read), not CuPy's
    isfinite, all and stack: the same verdict, for an inf or NaN in any gradient (the last slot
    of a second launch too), views and a float64 gradient (the generic way) included."""
    import cupy

    from smallem.backends.precision import all_finite

    gpu = get_backend("gpu", "fp16")
    rng = np.random.default_rng(2)
    grads = [cupy.asarray(rng.normal(size=s), dtype=np.float32) for s in [(3, 5), (7,), (4, 4)] * 4]
    grads.append(cupy.asarray(rng.normal(size=(6, 8)), dtype=np.float32)[:, ::2])  # a view
    if bad is not None:
        grads[-2][1, 2] = bad
    want = bad is None
    assert gpu.all_finite(grads) is want
    assert all_finite(gpu, grads) is want
    assert gpu.all_finite(grads + [cupy.zeros(3)]) is None  # float64: not the kernels' to take
    assert all_finite(gpu, grads + [cupy.zeros(3)]) is want

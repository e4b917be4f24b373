"""Ranks on the GPU (ranks/nccl.py, training/ranked.py): one rank through NCCL, its all-reduce
recorded in the captured step (buckets on a side stream, joined by events), follows the plain
single-GPU step; the graph is really replayed. Two GPUs, when a machine lends them, run the same
code with mpiexec -n 2 (benchmarks/ranks_record.py)."""

import numpy as np
import pytest

from smallem.backends import get_backend, gpu_available
from smallem.models.mlp import Mlp, MlpConfig
from smallem.optim import AdamW

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]

SIZES = MlpConfig()  # 402,721 parameters: with 64 KiB buckets, a dozen NCCL calls per step


def _run(step_of, steps=6):
    be = get_backend("gpu")
    model = Mlp(SIZES, be, seed=0)
    step = step_of(be, model, AdamW(1e-3))
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        x = rng.integers(0, 257, (64, 17))
        losses.append(float(be.item(step(x[:, :16], x[:, 16]))))
    params = {n: be.to_numpy(p.value) for n, p in model.named_parameters()}
    return step, losses, params


@pytest.mark.parametrize("overlap", [False, True])
def test_one_nccl_rank_in_the_captured_step_follows_the_plain_step(overlap):
    from smallem.ranks import Solo
    from smallem.ranks.nccl import NcclWorld
    from smallem.training.ranked import RankedStep
    from smallem.training.step import make_step

    _, want_losses, want = _run(lambda be, m, o: make_step(be, m, o, capture=False))
    world = NcclWorld(Solo())
    step, losses, got = _run(lambda be, m, o: RankedStep(be, m, o, world, overlap=overlap,
                                                          bucket_bytes=64 << 10))
    assert step.captured is not None and step.captured.failed is None, step.captured.failed
    assert step.captured.graph is not None and step.captured.replays >= 3
    assert len(step.buckets.sizes) > 2  # several NCCL calls in the graph, one per bucket
    np.testing.assert_allclose(losses, want_losses, rtol=2e-5)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=2e-5, err_msg=name)

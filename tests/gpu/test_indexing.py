"""The GPU's indexing kernels (cuda/indexing.py) and the pinned index uploads against NumPy:
scatter-add with repeated rows, gather.
Skipped, with the reason, where CuPy sees no device."""

import numpy as np
import pytest

from smallem.backends import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]


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


def test_index_uploads_through_the_pinned_ring_arrive_intact(gpu):
    """More uploads than the ring has buffers, of varying sizes, each checked after all."""
    rng = np.random.default_rng(11)
    hosts = [rng.integers(0, 1000, size=(int(rng.integers(1, 5000)),)) for _ in range(40)]
    devs = [gpu.indices(h) for h in hosts]
    for h, d in zip(hosts, devs):
        np.testing.assert_array_equal(gpu.to_numpy(d), h)

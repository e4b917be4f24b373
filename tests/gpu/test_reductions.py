"""The column sums of cuda/reductions.py on the GPU: the wide kernel (float4 reads, widths a
multiple of 4) and the 32-column ones, each against float64 sums of the same float32 values,
bit for bit the same at every run (a fixed order). Without a GPU, the wide pass's chunking."""

import numpy as np
import pytest

from smallem.backends import gpu_available
from smallem.backends.cuda import reductions


@pytest.mark.parametrize("rows, cols", [(16384, 512), (16384, 2048), (16384, 1536), (4096, 128),
                                        (1, 4), (100, 8), (5001, 72), (33, 4096)])
def test_the_wide_chunks_cover_every_row_once_in_multiples_of_32(rows, cols):
    chunk, chunks = reductions.wide_chunks(rows, cols)
    assert chunk % 32 == 0 and chunk >= 64 or chunks == 1
    assert (chunks - 1) * chunk < rows <= chunks * chunk  # the last chunk holds at least one row
    groups = (cols // 4 + 31) // 32
    assert chunks == 1 or groups * chunks >= reductions.WIDE_BLOCKS // 2 or chunk == 64


@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("cols", [4, 132, 512, 2048])
@pytest.mark.parametrize("rows", [1, 31, 33, 64, 257, 4096, 5001])
@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")
def test_column_sums_match_float64_and_repeat_bit_for_bit(gpu, monkeypatch, rows, cols, wide):
    import cupy

    calls = []
    real = reductions._wide
    monkeypatch.setattr(reductions, "WIDE", wide)
    monkeypatch.setattr(reductions, "_wide", lambda *a: (calls.append(a[2:]), real(*a)))
    x = np.random.default_rng(rows * cols).normal(size=(rows, cols)).astype(np.float32)
    dx = cupy.asarray(x)
    first, second = cupy.empty(cols, np.float32), cupy.empty(cols, np.float32)
    reductions.column_sums(dx, first, rows, cols)
    reductions.column_sums(dx, second, rows, cols)
    assert calls == ([(rows, cols)] * 2 if wide else [])  # the path the switch selects ran
    np.testing.assert_allclose(first.get(), x.astype(np.float64).sum(0), rtol=1e-5, atol=1e-4)
    assert np.array_equal(first.get(), second.get())


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")
def test_a_width_not_a_multiple_of_4_or_a_misaligned_array_takes_the_32_column_kernels(gpu, monkeypatch):
    import cupy

    calls = []
    monkeypatch.setattr(reductions, "_wide", lambda *a: calls.append(a))
    x = np.random.default_rng(3).normal(size=(300 * 8 + 1,)).astype(np.float32)
    dx = cupy.asarray(x)
    for view, rows, cols in ((dx[:300 * 7].reshape(300, 7), 300, 7),  # 7 wide
                             (dx[1:].reshape(300, 8), 300, 8)):  # starts 4 bytes in
        out = cupy.empty(cols, np.float32)
        reductions.column_sums(view, out, rows, cols)
        np.testing.assert_allclose(out.get(), view.get().astype(np.float64).sum(0), rtol=1e-5, atol=1e-4)
    assert calls == []

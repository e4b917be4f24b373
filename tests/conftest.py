"""Shared fixtures: the backends under test, with the GPU skipped where there is none."""

import pytest

from smallem.backends import get_backend, gpu_available

GPU = pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")


@pytest.fixture(params=["cpu64", "cpu", pytest.param("gpu", marks=[pytest.mark.gpu, GPU])])
def backend(request):
    """Every backend present on this machine."""
    return get_backend(request.param)


@pytest.fixture
def cpu64():
    return get_backend("cpu64")

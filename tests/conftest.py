"""Shared fixtures: the backends under test, with the GPU skipped where there is none."""

import numpy as np
import pytest

from smallem.backends import get_backend, gpu_available

GPU = pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")


@pytest.fixture(params=["cpu64", "cpu", pytest.param("gpu", marks=[pytest.mark.gpu, GPU])])
def backend(request):
    """Every backend present on this machine."""
    return get_backend(request.param)


@pytest.fixture(scope="module")
def gpu():
    """The GPU backend in float32 (tests/gpu/: each file marks itself gpu and skips without one)."""
    return get_backend("gpu")


@pytest.fixture
def cpu64():
    return get_backend("cpu64")


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """A small folder of code-like text for command-line runs (test files with a corpus of
    their own override it); token runs cache their merges beside it, never in the user's cache."""
    monkeypatch.setenv("SMALLEM_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "corpus"
    folder.mkdir()
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "value", "import", "class", "for", "in", "(x):", "\n"]
    for k in range(12):
        (folder / f"doc{k:02d}.py").write_text(" ".join(rng.choice(words, 300)))
    return folder

"""The GPU tests' backend: one per module, float32 on the device."""

import pytest

from smallem.backends import get_backend


@pytest.fixture(scope="module")
def gpu():
    return get_backend("gpu")

"""Backends: where tensors live and where arithmetic runs.

The protocol (protocol.py) is the floor; `get_backend` here is the face every other layer uses.
`ArrayBackend` (array.py) implements it once for any NumPy-like module; numpy.py and cupy.py pick
the module, the dtype and what must differ; the GPU's kernels and fused table live in cuda/.
"""

from __future__ import annotations

from ..errors import SmallemError
from .precision import PRECISIONS, get_format
from .protocol import DEFAULT_BACKEND, Backend, Shape, Tensor, on_device

__all__ = ["Backend", "Tensor", "Shape", "DEFAULT_BACKEND", "BACKEND_NAMES", "get_backend",
           "gpu_available", "PRECISIONS", "on_device"]

BACKEND_NAMES = ("auto", "cpu", "cpu64", "gpu")


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean "no GPU here"
        return False


_cache: dict[str, Backend] = {}


def get_backend(name: str | Backend = "auto", precision: str | None = None) -> Backend:
    """Return the backend called `name`: "cpu64" (NumPy float64), "cpu" (NumPy float32),
    "gpu" (CuPy float32), or "auto" (the GPU when CuPy sees one, else "cpu"). `precision`
    (precision.py: fp32, tf32, bf16, fp16) is what its matrix products read; None keeps the
    backend's own (fp32 for one named here)."""
    if not isinstance(name, str):
        if precision is None or precision == getattr(name, "precision", "fp32"):
            return name
        name = name.name  # the same kind of backend, in another precision
    if name == "auto":
        name = "gpu" if gpu_available() else "cpu"
    precision = precision or "fp32"
    key = name if precision == "fp32" else f"{name}:{precision}"
    if key in _cache:
        return _cache[key]
    get_format(precision)  # an unknown precision: its sentence, before anything is built
    if name in ("cpu", "cpu64"):
        from .numpy import NumpyBackend

        backend: Backend = NumpyBackend("float64" if name == "cpu64" else "float32", precision)
    elif name == "gpu":
        backend = _gpu_backend(precision)
    else:
        raise SmallemError(
            f"unknown backend {name!r}: choose one of {', '.join(BACKEND_NAMES)}"
        )
    _cache[key] = backend
    return backend


def _gpu_backend(precision: str) -> Backend:
    try:
        import cupy  # noqa: F401
    except ImportError:
        raise SmallemError(
            "--backend gpu needs CuPy, which is not installed: run `pip install cupy-cuda12x` "
            "or `pip install cupy-cuda13x`, for the CUDA version `nvidia-smi` prints "
            "(the extras smallem[gpu-cuda12] and smallem[gpu-cuda13] do the same), "
            "or use --backend cpu"
        ) from None
    if not gpu_available():
        raise SmallemError(
            "--backend gpu found CuPy but no CUDA device: check `nvidia-smi`, "
            "or use --backend cpu"
        )
    from .cupy import CupyBackend

    return CupyBackend(precision)

"""Backends: where tensors live and where arithmetic runs.

The tape, the operations, the modules and the optimizers see tensors only through the
`Backend` protocol below. `ArrayBackend` (array.py) implements it once for any NumPy-like
module; `numpy.py` and `cupy.py` pick the module, the dtype and the kernels that must differ.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from ..errors import SmallemError

Tensor = Any  # a numpy.ndarray or a cupy.ndarray, depending on the backend
Shape = tuple[int, ...]


@runtime_checkable
class Backend(Protocol):
    """Every primitive the tape, the operations and the optimizers use. No forwarding."""

    name: str  # "cpu64", "cpu" or "gpu"
    dtype: Any  # numpy.float64 or numpy.float32
    kernels: dict[str, Any]  # operation name -> fused kernel (forward, backward); may be empty
    rules: dict[str, Any]  # primitive name -> fused rule (signature of tape.RULES); may be empty

    # creation and transfer
    def tensor(self, data: Any) -> Tensor: ...
    def to_numpy(self, x: Tensor) -> Any: ...
    def indices(self, data: Any) -> Tensor: ...
    def zeros(self, shape: Sequence[int]) -> Tensor: ...
    def full(self, shape: Sequence[int], value: float) -> Tensor: ...
    def shape(self, x: Tensor) -> Shape: ...
    def item(self, x: Tensor) -> float: ...
    def synchronize(self) -> None: ...

    # elementwise, broadcasting like NumPy (b may be a Python float)
    def add(self, a: Tensor, b: Tensor | float) -> Tensor: ...
    def sub(self, a: Tensor, b: Tensor | float) -> Tensor: ...
    def mul(self, a: Tensor, b: Tensor | float) -> Tensor: ...
    def div(self, a: Tensor, b: Tensor | float) -> Tensor: ...
    def neg(self, a: Tensor) -> Tensor: ...
    def exp(self, a: Tensor) -> Tensor: ...
    def log(self, a: Tensor) -> Tensor: ...
    def sqrt(self, a: Tensor) -> Tensor: ...
    def tanh(self, a: Tensor) -> Tensor: ...
    def sigmoid(self, a: Tensor) -> Tensor: ...
    def relu(self, a: Tensor) -> Tensor: ...
    def square(self, a: Tensor) -> Tensor: ...
    def abs(self, a: Tensor) -> Tensor: ...
    def sign(self, a: Tensor) -> Tensor: ...
    def clip(self, a: Tensor, low: float, high: float) -> Tensor: ...
    def positive(self, a: Tensor) -> Tensor: ...  # 1.0 where a > 0, else 0.0
    def inside(self, a: Tensor, low: float, high: float) -> Tensor: ...  # 1.0 where low <= a <= high

    # shape and reductions
    def matmul(self, a: Tensor, b: Tensor) -> Tensor: ...
    def transpose(self, a: Tensor, dim0: int, dim1: int) -> Tensor: ...
    def reshape(self, a: Tensor, shape: Sequence[int]) -> Tensor: ...
    def broadcast_to(self, a: Tensor, shape: Sequence[int]) -> Tensor: ...
    def sum(self, a: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor: ...
    def mean(self, a: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor: ...
    def max(self, a: Tensor, dim: int, keepdim: bool = False) -> Tensor: ...

    # indexing: an embedding lookup and its gradient
    def gather_rows(self, table: Tensor, rows: Tensor) -> Tensor: ...
    def scatter_add_rows(self, values: Tensor, rows: Tensor, num_rows: int) -> Tensor: ...
    def take_along_last(self, a: Tensor, index: Tensor) -> Tensor: ...  # a[..., index[...]]
    def one_hot(self, index: Tensor, classes: int) -> Tensor: ...

    # optimizer updates, in place (a GPU backend fuses each into one kernel)
    def sgd_step(self, param: Tensor, grad: Tensor, lr: float) -> None: ...
    def adamw_step(self, param: Tensor, grad: Tensor, m: Tensor, v: Tensor, *, lr: float,
                   beta1: float, beta2: float, eps: float, weight_decay: float,
                   bias_correction1: float, bias_correction2: float) -> None: ...
    # the same over every parameter at once (weight decay per parameter): one launch on a GPU
    def sgd_step_many(self, params: Sequence[Tensor], grads: Sequence[Tensor], lr: float
                      ) -> None: ...
    def adamw_step_many(self, params: Sequence[Tensor], grads: Sequence[Tensor],
                        ms: Sequence[Tensor], vs: Sequence[Tensor], *, lr: float, beta1: float,
                        beta2: float, eps: float, weight_decays: Sequence[float],
                        bias_correction1: float, bias_correction2: float) -> None: ...


BACKEND_NAMES = ("auto", "cpu", "cpu64", "gpu")


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean "no GPU here"
        return False


_cache: dict[str, Backend] = {}


def get_backend(name: str | Backend = "auto") -> Backend:
    """Return the backend called `name`: "cpu64" (NumPy float64), "cpu" (NumPy float32),
    "gpu" (CuPy float32), or "auto" (the GPU when CuPy sees one, else "cpu")."""
    if not isinstance(name, str):
        return name
    if name == "auto":
        name = "gpu" if gpu_available() else "cpu"
    if name in _cache:
        return _cache[name]
    if name in ("cpu", "cpu64"):
        from .numpy import NumpyBackend

        backend: Backend = NumpyBackend("float64" if name == "cpu64" else "float32")
    elif name == "gpu":
        backend = _gpu_backend()
    else:
        raise SmallemError(
            f"unknown backend {name!r}: choose one of {', '.join(BACKEND_NAMES)}"
        )
    _cache[name] = backend
    return backend


def _gpu_backend() -> Backend:
    try:
        import cupy  # noqa: F401
    except ImportError:
        raise SmallemError(
            "--backend gpu needs CuPy, which is not installed: "
            "run `pip install -e '.[gpu]'` (CUDA 12) or `pip install cupy-cuda13x` (CUDA 13), "
            "or use --backend cpu"
        ) from None
    if not gpu_available():
        raise SmallemError(
            "--backend gpu found CuPy but no CUDA device: check `nvidia-smi`, "
            "or use --backend cpu"
        )
    from .cupy import CupyBackend

    return CupyBackend()

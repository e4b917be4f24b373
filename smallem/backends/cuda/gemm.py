"""Matrix products on the GPU backend: cuBLAS called directly, so that a CUDA graph can record them.

cupy.py's matmul and fused["matmul"] land here. 2-D products are one `cublasSgemm_v2`; 3-D/4-D
ones (attention's q·kᵀ and p·v, a Linear over (B, T, C)) one `cublasSgemmStridedBatched`, or one
plain GEMM when the batch folds into the rows. Both are called through ctypes on CuPy's handle:
CuPy's own binding sets the stream first, which a capturing stream forbids. Anything else returns
None (cupy.matmul runs).
"""

from __future__ import annotations

import ctypes
import math
from functools import cache
from typing import Any

import numpy as np

from . import halves
from .common import F32, _empty, cupy
from .tensor_cores import Lt

try:  # cuBLAS through CuPy's thin binding: 21 µs of host time a call where `a @ b` takes 28
    from cupy_backends.cuda.libs import cublas as _cublas
except ImportError:  # pragma: no cover - an older or newer layout: `@` still works
    _cublas = None

_ONE = np.ones(1, np.float32)  # alpha and beta for cuBLAS, read from host memory
_ZERO = np.zeros(1, np.float32)
_ONE_PTR, _ZERO_PTR = _ONE.ctypes.data, _ZERO.ctypes.data  # `.ctypes.data` costs 2 µs a read
OP_N, OP_T = 0, 1  # cublasOperation_t


@cache
def _library() -> Any:
    """The cuBLAS library CuPy has loaded (the same one its handle belongs to)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcublas.so" in line}
    if not paths:
        raise RuntimeError("cuBLAS is not loaded in this process")
    return ctypes.CDLL(sorted(paths)[0])


def _checked(fn: Any, name: str) -> Any:
    def call(*args: Any) -> None:
        status = fn(*args)
        if status:
            raise RuntimeError(f"{name} failed with status {status}")

    return call


@cache
def raw_sgemm() -> Any:
    """cublasSgemm_v2 through ctypes: it runs on the handle's stream as it stands."""
    fn = _library().cublasSgemm_v2
    p, i = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [p, i, i, i, i, i, p, p, i, p, i, p, p, i]
    fn.restype = i
    return _checked(fn, "cublasSgemm_v2")


@cache
def raw_sgemm_batched() -> Any:
    """cublasSgemmStridedBatched through ctypes (strides in elements, 64-bit)."""
    fn = _library().cublasSgemmStridedBatched
    p, i, q = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    fn.argtypes = [p, i, i, i, i, i, p, p, i, q, p, i, q, p, p, i, q, i]
    fn.restype = i
    return _checked(fn, "cublasSgemmStridedBatched")


def matrix_layout(x: Any) -> tuple[int, int] | None:
    """How cuBLAS reads the last two dimensions of x: (operation, leading dimension) for a
    row-major array or a view of one with its last two dimensions swapped (what the tape's
    transpose(-1, -2) gives); None for anything else."""
    if x._c_contiguous:
        return OP_N, x.shape[-1]
    if x.ndim == 2:
        return (OP_T, x.shape[0]) if x._f_contiguous else None
    if x.strides[-2] == 4 and x.swapaxes(-1, -2)._c_contiguous:
        return OP_T, x.shape[-2]
    return None


def _batch_stride(x: Any, batch: tuple[int, ...]) -> int | None:
    """Elements between one matrix of x and the next over the broadcast batch: 0 when x is one
    matrix used for all, its matrix size when it has the whole batch; None otherwise."""
    own = x.shape[:-2]
    if math.prod(own) == 1:
        return 0
    if len(own) == len(batch) and own == batch:
        return x.shape[-2] * x.shape[-1]
    return None


def _readable(x: Any, batch: tuple[int, ...]) -> tuple[Any, tuple[int, int], int]:
    """x, its layout and its batch stride; x copied to a row-major array of the whole batch
    first when cuBLAS cannot read it as it is."""
    stride = _batch_stride(x, batch)
    if stride is None:  # stretched on some batch dimensions only: made whole
        x = cupy.ascontiguousarray(cupy.broadcast_to(x, batch + x.shape[-2:]))
        return x, (OP_N, x.shape[-1]), x.shape[-2] * x.shape[-1]
    layout = matrix_layout(x)
    if layout is None:
        x = cupy.ascontiguousarray(x)
        layout = (OP_N, x.shape[-1])
    return x, layout, stride


def _ran(ran: bool) -> None:
    if not ran:  # a plain product in a precision cuBLASLt serves: it never refuses one
        raise RuntimeError("cuBLASLt found no algorithm for a plain product")


class Gemm:
    """The products of one backend (its handle, and whether a graph is being recorded)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.lt: Any = None  # cuBLASLt, made at the first product of a lower precision

    def _lt(self) -> Lt:
        if self.lt is None:
            self.lt = Lt()
        return self.lt

    def _call(self, raw: Any, binding: Any, args: tuple) -> None:
        handle = args[0]
        if self.backend.capturing:  # the stream was set before capture began
            raw()(*args)
        elif binding is not None:
            _cublas.setPointerMode(handle, _cublas.CUBLAS_POINTER_MODE_HOST)
            binding(*args)
        else:  # no binding for it: the raw call, on the current stream set by hand
            _cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
            _cublas.setPointerMode(handle, _cublas.CUBLAS_POINTER_MODE_HOST)
            raw()(*args)

    def matmul(self, a: Any, b: Any) -> Any | None:
        """a @ b as one cuBLAS call, or None when the operands are not float32 device arrays
        of a layout cuBLAS reads as it is. cuBLAS is column-major: it computes Cᵀ = Bᵀ·Aᵀ,
        and a row-major array read column-major is its own transpose, so nothing is copied."""
        if (_cublas is None or type(a) is not _empty or type(b) is not _empty
                or a.ndim < 2 or b.ndim < 2 or a.dtype != F32 or b.dtype != F32
                or a.shape[-1] != b.shape[-2] or 0 in a.shape or 0 in b.shape):
            return None
        if a.ndim == 2 and b.ndim == 2:  # the MLP's products: no batch to work out, and a
            layout_a, layout_b = matrix_layout(a), matrix_layout(b)  # plain step is host time
            if layout_a is not None and layout_b is not None:
                m, n = a.shape[0], b.shape[1]
                return self._gemm(m, n, a.shape[1], a, layout_a, b, layout_b, (m, n))
        try:
            batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        except ValueError:
            return None
        # An operand cuBLAS cannot read as it is (heads split by a transpose(1, 2), a batch
        # stretched on some dimensions only) is copied first: a kernel, which a graph records.
        a, layout_a, stride_a = _readable(a, batch)
        b, layout_b, stride_b = _readable(b, batch)
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        if a.ndim == 2 and b.ndim == 2:
            return self._gemm(m, n, k, a, layout_a, b, layout_b, (m, n))
        if stride_b == 0 and a._c_contiguous:  # (B, T, C) @ (C, C'): the batch folds into rows
            rows = a.size // k
            return self._gemm(rows, n, k, a, (OP_N, k), b, layout_b, batch + (m, n))
        count = int(np.prod(batch))
        out = _empty(batch + (m, n), F32)
        if count == 0:
            return out
        if self.backend.precision != "fp32":  # tensor cores: cuBLASLt (tensor_cores.py)
            _ran(self._lt().gemm(self.backend.precision, layout_b[0], layout_a[0], n, m, k, b,
                                 layout_b[1], a, layout_a[1], out, n, count,
                                 (stride_b, stride_a, m * n)))
            return out
        handle = self.backend._handle()
        args = (handle, layout_b[0], layout_a[0], n, m, k, _ONE_PTR, b.data.ptr, layout_b[1],
                stride_b, a.data.ptr, layout_a[1], stride_a, _ZERO_PTR, out.data.ptr, n, m * n,
                count)
        self._call(raw_sgemm_batched, None, args)
        return out

    def _gemm(self, m: int, n: int, k: int, a: Any, layout_a: tuple, b: Any, layout_b: tuple,
              shape: tuple) -> Any:
        out = _empty(shape, F32)
        if self.backend.precision != "fp32":
            _ran(self._lt().gemm(self.backend.precision, layout_b[0], layout_a[0], n, m, k, b,
                                 layout_b[1], a, layout_a[1], out, n))
            return out
        args = (self.backend._handle(), layout_b[0], layout_a[0], n, m, k, _ONE_PTR,
                b.data.ptr, layout_b[1], a.data.ptr, layout_a[1], _ZERO_PTR, out.data.ptr, n)
        self._call(raw_sgemm, _cublas.sgemm, args)
        return out

    def weight_gradient(self, a: Any, grad: Any) -> Any | None:
        """Σ over the batch of aᵀ @ grad for a (..., m, k) row-major and grad (..., m, n): the
        gradient of a 2-D weight used on every row, as one GEMM over all rows (the reference
        rule makes one product per batch element, then sums them)."""
        if not (a._c_contiguous and grad._c_contiguous and grad.dtype == F32):
            return None
        k, n = a.shape[-1], grad.shape[-1]
        rows = a.size // k
        # (rows, k)ᵀ @ (rows, n): a read as the transpose of a row-major (rows, k) matrix
        return self._gemm(k, n, rows, a, (OP_T, k), grad, (OP_N, n), (k, n))


def matmul_rule(be: Any, grad: Any, out: Any, a: Any, b: Any) -> tuple | None:
    """fused["matmul"] for x (..., T, C) @ W (C, C'), a product over a batch of sequences (a
    Linear without bias, or any Linear with linear.EPILOGUES off; with a bias nn.Linear records
    `linear`, linear.py): dx = dy @ Wᵀ as one GEMM over all rows, and dW = Σ xᵀ @ dy as one
    GEMM, not a batched product and a sum. Other shapes decline: the reference rule runs."""
    if (type(a) is not _empty or type(b) is not _empty or b.ndim != 2 or a.ndim < 3
            or type(grad) is not _empty or not grad._c_contiguous):
        return None
    gemm: Gemm = be._gemm
    if halves.wanted(be.precision):  # both products read dy: its 16-bit copy made once, if need be
        halves.rounded(grad, be.precision, keep=True)
    dw = gemm.weight_gradient(a, grad)
    if dw is None:
        return None
    dx = gemm.matmul(grad, b.T)
    return (dx, dw) if dx is not None else None

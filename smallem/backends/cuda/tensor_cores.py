"""Matrix products on the tensor cores: cuBLASLt with bf16, fp16 or TF32 inputs, float32 sums.

gemm.py hands a product here when its backend's precision is not fp32. A bf16/fp16 product reads
the 16-bit copies of its float32 inputs (rounded to nearest even, as precision.round_to does on
the CPU) that the kernels which made them wrote beside them (halves.py), and writes float32;
TF32 reads the float32 inputs as they are (the H200 rounds them to nearest, measured). cuBLASLt
is called through ctypes: CuPy has no binding of it, nvmath-python is not on the device, and
cublasLtMatmul takes its stream as an argument, so a CUDA graph records it as it is. Its epilogue
can add a bias (and GELU) to the output or sum A into a bias gradient (BGRADA), alpha scales
it, and a C read with beta 1 adds a residual: linear.py's Linear uses the bias epilogues (and C)
in every precision, fp32 included (float32 inputs, COMPUTE_32F). A product cuBLASLt has no
algorithm for is refused (False), never half run.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import numpy as np

from . import halves
from .common import cupy

CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14  # cudaDataType_t
COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 68, 77  # cublasComputeType_t
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8  # MatmulDescAttributes
LAYOUT_BATCH_COUNT, LAYOUT_STRIDED_BATCH_OFFSET = 5, 6  # MatrixLayoutAttribute
PREF_MAX_WORKSPACE_BYTES = 1
# DEFAULT, BIAS, GELU|BIAS; BGRADA: D = A·B and the bias vector = A summed over the product's k
# (DGELU_BGRAD, 208, ran as a pass of its own after the product on the H200: round 9 deleted it)
EPILOGUE = {None: 1, "bias": 4, "gelu_bias": 36, "bgrada": 256}
WORKSPACE = 32 << 20  # what cuBLASLt may use for split-K and the like (PyTorch gives it 32 MiB)
INPUT_TYPE = {"fp32": CUDA_R_32F, "tf32": CUDA_R_32F, "bf16": CUDA_R_16BF, "fp16": CUDA_R_16F}
NOT_SUPPORTED = 15  # CUBLAS_STATUS_NOT_SUPPORTED: no kernel for this epilogue, type or layout

def _stored(x: Any) -> Any:
    """x as it lies in memory: itself, or (a transposed view) the row-major array it views."""
    return x if x._c_contiguous else x.swapaxes(-1, -2)


class Refused(RuntimeError):
    """cuBLASLt has no algorithm for a product (an epilogue it lacks for that layout or type)."""


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t),
                ("state", ctypes.c_int), ("wavesCount", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


@cache
def library() -> Any:
    """libcublasLt beside the libcublas CuPy loaded (cuBLAS itself is built on it)."""
    cupy.cuda.device.get_cublas_handle()  # makes CuPy load cuBLAS
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcublasLt.so" in line}
        if not paths:
            raise RuntimeError("cuBLASLt is not loaded in this process")
    lib = ctypes.CDLL(sorted(paths)[0])
    p, i, u64, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64
    sig = {"cublasLtCreate": [p], "cublasLtMatmulDescCreate": [p, i, i],
           "cublasLtMatmulDescSetAttribute": [p, i, p, ctypes.c_size_t],
           "cublasLtMatrixLayoutCreate": [p, i, u64, u64, i64],
           "cublasLtMatrixLayoutSetAttribute": [p, i, p, ctypes.c_size_t],
           "cublasLtMatmulPreferenceCreate": [p],
           "cublasLtMatmulPreferenceSetAttribute": [p, i, p, ctypes.c_size_t],
           "cublasLtMatmulAlgoGetHeuristic": [p, p, p, p, p, p, p, i, p, p],
           "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, p, p, ctypes.c_size_t, p]}
    for name, args in sig.items():
        getattr(lib, name).argtypes, getattr(lib, name).restype = args, i
    return lib


def _ok(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


def _set(setter: Any, obj: Any, attr: int, value: Any) -> None:
    _ok(setter(obj, attr, ctypes.byref(value), ctypes.sizeof(value)), "setting a cuBLASLt attribute")


class Plan:
    """One product's descriptors and algorithm, made once per shape and kept (a graph's replays
    read the same ones)."""

    def __init__(self, lt: Lt, precision: str, op_a: int, op_b: int, m: int, n: int, k: int,
                 lda: int, ldb: int, ldd: int, batch: int, strides: tuple[int, int, int],
                 epilogue: str | None, bias: int = 0) -> None:
        lib, self.lt = library(), lt
        self.proven = False  # set by the first call cuBLASLt accepted
        compute = COMPUTE_32F_FAST_TF32 if precision == "tf32" else COMPUTE_32F  # fp32: exact
        self.desc = ctypes.c_void_p()
        _ok(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), compute, CUDA_R_32F), "MatmulDescCreate")
        for attr, value in ((DESC_TRANSA, op_a), (DESC_TRANSB, op_b)):
            _set(lib.cublasLtMatmulDescSetAttribute, self.desc, attr, ctypes.c_int32(value))
        _set(lib.cublasLtMatmulDescSetAttribute, self.desc, DESC_EPILOGUE,
             ctypes.c_uint32(EPILOGUE[epilogue]))
        if bias:  # the heuristic sees a real bias vector (its alignment), as every call will
            _set(lib.cublasLtMatmulDescSetAttribute, self.desc, DESC_BIAS_POINTER, ctypes.c_void_p(bias))
        kind = INPUT_TYPE[precision]
        rows_a, cols_a = (m, k) if op_a == 0 else (k, m)  # column-major, as stored
        rows_b, cols_b = (k, n) if op_b == 0 else (n, k)
        self.layouts = [self._layout(kind, rows_a, cols_a, lda, batch, strides[0]),
                        self._layout(kind, rows_b, cols_b, ldb, batch, strides[1]),
                        self._layout(CUDA_R_32F, m, n, ldd, batch, strides[2])]
        pref = ctypes.c_void_p()
        _ok(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        _set(lib.cublasLtMatmulPreferenceSetAttribute, pref, PREF_MAX_WORKSPACE_BYTES,
             ctypes.c_uint64(WORKSPACE))
        self.heuristic, found = _Heuristic(), ctypes.c_int(0)
        a, b, d = self.layouts
        status = lib.cublasLtMatmulAlgoGetHeuristic(lt.handle, self.desc, a, b, d, d, pref, 1,
                                                    ctypes.byref(self.heuristic), ctypes.byref(found))
        if status == NOT_SUPPORTED or (status == 0 and found.value == 0):
            raise Refused(f"cuBLASLt has no algorithm for this {precision} product ({epilogue})")
        _ok(status, "AlgoGetHeuristic")

    @staticmethod
    def _layout(kind: int, rows: int, cols: int, ld: int, batch: int, stride: int) -> ctypes.c_void_p:
        lib, layout = library(), ctypes.c_void_p()
        _ok(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), kind, rows, cols, ld), "LayoutCreate")
        if batch > 1:
            _set(lib.cublasLtMatrixLayoutSetAttribute, layout, LAYOUT_BATCH_COUNT, ctypes.c_int32(batch))
            _set(lib.cublasLtMatrixLayoutSetAttribute, layout, LAYOUT_STRIDED_BATCH_OFFSET,
                 ctypes.c_int64(stride))
        return layout

    def run(self, a: int, b: int, d: int, alpha: float = 1.0, bias: int = 0, c: int = 0) -> None:
        """D = alpha·A·B [+ bias], and + C (beta 1, C laid out as D) when c is given."""
        lib = library()
        if bias:
            _set(lib.cublasLtMatmulDescSetAttribute, self.desc, DESC_BIAS_POINTER, ctypes.c_void_p(bias))
        scale = self.lt.scalar(alpha)
        la, lb, ld = self.layouts
        beta, c = (self.lt.one, c) if c else (self.lt.zero, d)
        status = lib.cublasLtMatmul(self.lt.handle, self.desc, scale, a, la, b, lb, beta, c,
                                    ld, d, ld, ctypes.byref(self.heuristic.algo),
                                    self.lt.workspace.data.ptr, WORKSPACE,
                                    cupy.cuda.get_current_stream().ptr)
        if status and not self.proven:  # its first call refused what the heuristic chose
            raise Refused(f"cublasLtMatmul refused the product its heuristic chose ({status})")
        _ok(status, "cublasLtMatmul")
        self.proven = True


class Lt:
    """One cuBLASLt handle, its workspace and its plans (one per product shape)."""

    def __init__(self) -> None:
        self.handle = ctypes.c_void_p()
        _ok(library().cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.workspace = cupy.empty(WORKSPACE, dtype=np.uint8)  # kept: a graph's replays use it
        self.plans: dict[tuple, Plan | None] = {}  # None: refused (the caller runs another way)
        self._scalars: dict[float, np.ndarray] = {}  # alpha in host memory, kept alive
        self.zero, self.one = self.scalar(0.0), self.scalar(1.0)

    def scalar(self, value: float) -> int:
        if value not in self._scalars:
            self._scalars[value] = np.full(1, value, np.float32)
        return self._scalars[value].ctypes.data

    def gemm(self, precision: str, op_a: int, op_b: int, m: int, n: int, k: int, a: Any, lda: int,
             b: Any, ldb: int, d: Any, ldd: int, batch: int = 1, strides: tuple = (0, 0, 0),
             alpha: float = 1.0, bias: Any = None, epilogue: str | None = None, c: Any = None) -> bool:
        """D (m×n, column-major, float32) = alpha·op(A)·op(B) [+ bias, GELU; or the bias
        gradient written to `bias`] [+ C, laid out as D: a residual added by the product], A and B
        float32 device arrays read as their 16-bit copies in bf16/fp16 (their layout kept).
        False, and nothing run, when cuBLASLt has no algorithm for it (asked once per shape):
        the caller computes it another way."""
        key = (precision, op_a, op_b, m, n, k, lda, ldb, ldd, batch, strides, c is not None, epilogue)
        if key not in self.plans:
            try:
                self.plans[key] = Plan(self, precision, op_a, op_b, m, n, k, lda, ldb, ldd, batch,
                                       strides, epilogue, 0 if bias is None else bias.data.ptr)
            except Refused:
                self.plans[key] = None
        plan = self.plans[key]
        if plan is None:
            return False
        if precision in halves.PRECISIONS:  # 16-bit copies as stored: op and ld still describe them
            a, b = halves.rounded(_stored(a), precision), halves.rounded(_stored(b), precision)
        try:
            plan.run(a.data.ptr, b.data.ptr, d.data.ptr, alpha, 0 if bias is None else bias.data.ptr,
                     0 if c is None else c.data.ptr)
        except Refused:  # met on a plan's first (plain) run, never inside a recorded graph
            self.plans[key] = None
            return False
        return True

"""The GPU backend: CuPy in float32, with the kernels that must differ from NumPy.

Everything not overridden here is ArrayBackend's code running on cupy. Here: which kernel of the
kernel room (backends/cuda/, one file per concept) each primitive and update launches, the fused
table the tape reads, pinned index uploads and CUDA-graph capture.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import cupy
import numpy as np

from . import cuda
from .array import ArrayBackend
from .cuda import gelu, halves, indexing, optimizers
from .cuda.common import F32, I64, _empty, contiguous, f32, launch
from .cuda.common import fast as _fast
from .cuda.elementwise import UNARY, add_with_copy, elementwise, swap_middle
from .cuda.gemm import Gemm, _cublas
from .cuda.reductions import column_sums
from .protocol import Tensor


def _trailing_block(small: tuple, big: tuple) -> bool:
    """True when `small`, broadcast to `big`, repeats one block of big's last dimensions
    (a bias row, a scalar, the same shape): then small's index is i % small.size."""
    k = 0
    while k < len(small) and small[k] == 1:
        k += 1
    core = small[k:]
    return len(small) <= len(big) and (not core or big[len(big) - len(core):] == core)


class _PinnedUploads:
    """Host → device copies of index batches that never wait for the GPU.

    Copying from ordinary (pageable) host memory makes CUDA wait until the GPU has finished
    everything queued: one hidden sync per batch. A copy from pinned memory is queued like a
    kernel. A ring of pinned buffers; one is reused only once its last copy is done (its event),
    which, eight batches later, it always is."""

    def __init__(self, slots: int = 8) -> None:
        self.slots: list[list[Any]] = [[None, 0, cupy.cuda.Event(disable_timing=True)]
                                       for _ in range(slots)]
        self.next = 0

    def upload(self, host: np.ndarray, out: Any = None) -> Any:
        """`host` copied to a new device array, or into `out` (a fixed buffer a captured graph
        reads), queued on the current stream."""
        slot = self.slots[self.next]
        self.next = (self.next + 1) % len(self.slots)
        out = _empty(host.shape, host.dtype) if out is None else out
        if host.nbytes == 0:
            return out
        slot[2].synchronize()  # its last copy is done: the buffer may be rewritten or freed
        if slot[1] < host.nbytes:
            slot[1] = max(host.nbytes, 1 << 16)
            slot[0] = cupy.cuda.alloc_pinned_memory(slot[1])
        np.frombuffer(slot[0], host.dtype, host.size)[:] = host.reshape(-1)
        cupy.cuda.runtime.memcpyAsync(out.data.ptr, slot[0].ptr, host.nbytes,
                                      cupy.cuda.runtime.memcpyHostToDevice,
                                      cupy.cuda.get_current_stream().ptr)
        slot[2].record()
        return out


class CupyBackend(ArrayBackend):
    """CuPy, float32. `fused` and `fused_forward` are the kernel room's table (backends/cuda).

    Each CuPy call costs 15-50 µs of host time whatever the size, while the arithmetic of a
    whole step takes a few µs, so a step's speed is the number and the host cost of its
    launches: cuBLAS called directly, one RawKernel per elementwise op, no hidden sync (indices
    are copied from pinned memory). Every fast path takes contiguous float32 arrays only and
    hands anything else to the general code."""

    def __init__(self, precision: str = "fp32") -> None:
        super().__init__(cupy, "float32", "gpu", precision)
        self.fused = dict(cuda.FUSED)
        self.fused_forward = dict(cuda.FUSED_FORWARD)
        cuda.check_table(self.fused, self.fused_forward)
        for name in cuda.switched_off():  # the paths before (cuda/linear.py's switches)
            del self.fused[name], self.fused_forward[name]
        self._uploads = _PinnedUploads()
        self._cublas_handle: int | None = None
        self._gemm = Gemm(self)
        self.capturing = False  # set by capture(): no host reads, no cuBLAS setStream
        self._graph_constants: dict[tuple, Any] = {}  # host data uploaded inside a capture
        # fp16 captured: the device array [apply?, 1/scale] every update reads (cuda/scaler.py)
        self.update_gate: Any = None

    def upload_into(self, out: Any, host: np.ndarray) -> None:
        """Copy host data into an existing device buffer without waiting for the GPU (what a
        captured step does with each new batch before its graph is replayed)."""
        self._uploads.upload(contiguous(np.asarray(host, dtype=out.dtype)), out)

    # creation and transfer -------------------------------------------------------------
    def tensor(self, data: Any) -> Any:
        if _fast(data):
            return data  # already ours: a parameter bound to a new tape every step
        if type(data) is not cupy.ndarray:
            data = contiguous(np.asarray(data, dtype=F32))
            if self.capturing:
                return self._graph_constant(data)
        return contiguous(cupy.asarray(data, dtype=F32))

    def to_numpy(self, x: Any) -> np.ndarray:
        return cupy.asnumpy(x)

    def indices(self, data: Any) -> Any:
        if type(data) is cupy.ndarray:
            return contiguous(cupy.asarray(data, dtype=I64))
        if self.capturing:
            return self._graph_constant(contiguous(np.asarray(data, dtype=I64)))
        return self._uploads.upload(contiguous(np.asarray(data, dtype=I64)))

    def _graph_constant(self, host: np.ndarray) -> Any:
        """Host data met while a graph is recorded (position indices, a mask): a device buffer
        of the graph's, filled once when the recording ends. Nothing runs during a recording,
        so nobody reads it before then; a copy recorded instead would run at every replay, and
        a copy from pageable memory cannot be recorded at all. The same data twice in one
        recording gets one buffer."""
        key = (host.dtype.str, host.shape, host.tobytes())
        if key not in self._graph_constants:
            self._graph_constants[key] = (_empty(host.shape, host.dtype), host.copy())
        return self._graph_constants[key][0]

    def full(self, shape: Sequence[int], value: float) -> Any:
        out = _empty(tuple(shape), F32)
        launch(elementwise("fill"), out.size, (out, f32(value), out.size))
        return out

    def all_finite(self, grads: list) -> bool | None:
        """No inf or NaN in `grads` (float32): the finite-check kernels and one read; None for
        other dtypes (precision.all_finite then asks CuPy's isfinite)."""
        return cuda.scaler.all_finite(grads)

    def item(self, x: Any) -> float:
        return float(x)  # waits for the GPU: call it to log, not every step

    def synchronize(self) -> None:
        cupy.cuda.get_current_stream().synchronize()

    # elementwise ------------------------------------------------------------------------
    def _unary(self, name: str, a: Any) -> Any:
        out = _empty(a.shape, F32)
        launch(elementwise(f"unary_{name}"), a.size, (a, out, a.size))
        return out

    def _binary(self, name: str, a: Any, b: Any, general: Any) -> Any:
        if type(a) is cupy.ndarray and type(b) is cupy.ndarray:
            if _fast(a) and _fast(b):
                if name == "add" and a.shape == b.shape and halves.wanted(self.precision):
                    return add_with_copy(a, b, self.precision)  # a gradient a product reads
                if a.shape == b.shape or _trailing_block(b.shape, a.shape):
                    out = _empty(a.shape, F32)
                    launch(elementwise(f"binary_{name}"), a.size,
                           (a, b, out, a.size, max(b.size, 1)))
                    return out
                if name in ("add", "mul") and _trailing_block(a.shape, b.shape):
                    return self._binary(name, b, a, general)  # a bias first: commute
        elif isinstance(b, (int, float)) and _fast(a):
            out = _empty(a.shape, F32)
            launch(elementwise(f"binary_{name}_scalar_b"), a.size, (a, f32(b), out, a.size))
            return out
        elif isinstance(a, (int, float)) and _fast(b):
            out = _empty(b.shape, F32)
            launch(elementwise(f"binary_{name}_scalar_a"), b.size, (f32(a), b, out, b.size))
            return out
        return general(a, b)

    # One RawKernel per elementwise primitive (cuda/elementwise.py: `binary_<name>`, and
    # `unary_<name>` for each entry of its UNARY table, whose methods are made below the class);
    # anything the kernels cannot read falls back to ArrayBackend's CuPy code.
    def add(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self._binary("add", a, b, super().add)

    def sub(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self._binary("sub", a, b, super().sub)

    def mul(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self._binary("mul", a, b, super().mul)

    def div(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self._binary("div", a, b, super().div)

    def gelu(self, a: Tensor) -> Tensor:
        out = gelu.gelu(a, self.precision)  # one launch; anything else, the reference formula
        return out if out is not None else super().gelu(a)

    # shape and reductions ---------------------------------------------------------------
    def transpose(self, a: Tensor, dim0: int, dim1: int) -> Tensor:
        if a.ndim == 2 and (dim0 - dim1) % 2:
            return a.T  # a view; matmul below reads it as cuBLAS's "transposed" flag
        return super().transpose(a, dim0, dim1)

    def reshape(self, a: Tensor, shape: Sequence[int]) -> Tensor:
        if type(a) is cupy.ndarray and not a._c_contiguous:  # heads merged: one launch, and
            out = swap_middle(a, self.precision)  # the 16-bit copy the next product reads
            if out is not None:
                return out.reshape(tuple(shape))
        return super().reshape(a, shape)

    def matmul(self, a: Tensor, b: Tensor | float) -> Tensor:
        """A @ B as one cuBLAS call (cuda/gemm.py): 2-D, or batched over 3-D/4-D operands,
        transposed views read as they are; what cuBLAS cannot take goes to cupy.matmul."""
        out = self._gemm.matmul(a, b)
        return out if out is not None else super().matmul(a, b)

    def _handle(self) -> int:
        if self._cublas_handle is None:
            self._cublas_handle = cupy.cuda.device.get_cublas_handle()
        return self._cublas_handle

    def sum(self, a: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
        # Summing over the first dimension (a bias gradient, unbroadcast) is one kernel; CuPy's
        # general reduction costs ~45 µs of host time.
        if dim is not None and _fast(a) and a.ndim >= 2 and dim % a.ndim == 0 and a.size:
            rows, cols = a.shape[0], a.size // a.shape[0]
            out = _empty(((1,) if keepdim else ()) + a.shape[1:], F32)
            column_sums(a, out, rows, cols)
            return out
        return super().sum(a, dim, keepdim)

    # indexing ---------------------------------------------------------------------------
    def gather_rows(self, table: Tensor, rows: Tensor) -> Tensor:
        if not (_fast(table) and type(rows) is cupy.ndarray and rows.dtype == I64
                and rows._c_contiguous):
            return super().gather_rows(table, rows)
        width = table.size // table.shape[0] if table.shape[0] else 0
        out = _empty(rows.shape + table.shape[1:], F32)
        indexing.gather_rows(table, rows, out, width)
        return out

    def scatter_add_rows(self, values: Tensor, rows: Tensor, num_rows: int) -> Tensor:
        """out[rows[i]] += values[i] with atomicAdd: repeated rows all count. The order of the
        additions varies from run to run, so results agree to rounding, not bit for bit."""
        tail = tuple(values.shape[rows.ndim:])
        if not (_fast(values) and type(rows) is cupy.ndarray and rows.dtype == I64):
            return super().scatter_add_rows(values, rows, num_rows)
        rows = contiguous(rows)
        width = int(np.prod(tail))
        out = cupy.zeros((num_rows,) + tail, F32)
        indexing.scatter_add_rows(values, rows, out, width, num_rows)
        return out

    # optimizer updates, in place: one launch for up to MAX_SLOTS tensors (cuda/optimizers.py)
    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], *, lr: float) -> None:
        optimizers.sgd_update(params, grads, lr, self.precision, self.update_gate)

    def adamw_update(self, params: Sequence[Any], grads: Sequence[Any], ms: Sequence[Any],
                     vs: Sequence[Any], *, steps: Sequence[int], lr: float, beta1: float,
                     beta2: float, eps: float, weight_decays: Sequence[float],
                     corrections: Any = None) -> None:
        """AdamW on every parameter at once; `corrections`: a captured step's device array of
        each parameter's 1 − β1ᵗ, 1 − β2ᵗ, rewritten before each replay."""
        optimizers.adamw_update(params, grads, ms, vs, steps=steps, lr=lr, beta1=beta1,
                                beta2=beta2, eps=eps, weight_decays=weight_decays,
                                corrections=corrections, precision=self.precision,
                                gate=self.update_gate)

    @contextmanager
    def capture(self, stream: Any) -> Iterator[list[Any]]:
        """Record everything launched inside the block on `stream` into a CUDA graph (the one
        element of the yielded list, once the block is over) instead of running it. Memory
        allocated meanwhile comes from a pool of the graph's own, kept with it: CuPy's pool
        must never hand a block the graph writes to anyone else."""
        pool = cupy.cuda.MemoryPool()
        handle = self._handle()
        _cublas.setStream(handle, stream.ptr)  # the cuBLAS calls below are recorded there
        _cublas.setPointerMode(handle, _cublas.CUBLAS_POINTER_MODE_HOST)
        out: list[Any] = []
        self._graph_constants = {}
        with cupy.cuda.using_allocator(pool.malloc), stream:
            stream.begin_capture()
            self.capturing = True
            try:
                yield out
            finally:
                self.capturing = False
                graph = stream.end_capture()
        for device, host in self._graph_constants.values():
            device.set(host, stream=stream)  # before any replay, on the stream that replays
        stream.synchronize()
        out += [graph, pool, self._graph_constants]  # the constants live as long as the graph
        self._graph_constants = {}


def _unary_method(name: str) -> Any:
    """The backend's `name` (a key of cuda/elementwise.py's UNARY): one launch of
    `unary_<name>` on a contiguous float32 array, ArrayBackend's CuPy code on anything else."""
    general = getattr(ArrayBackend, name)

    def method(self: CupyBackend, a: Tensor) -> Tensor:
        return self._unary(name, a) if _fast(a) else general(self, a)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"{name}: one launch of unary_{name} (cuda/elementwise.py's UNARY table)"
    return method


for _name in UNARY:  # a new entry of the table is a new primitive's kernel and method at once
    setattr(CupyBackend, _name, _unary_method(_name))

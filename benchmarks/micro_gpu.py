"""Host time per call of the pieces a GPU training step is made of (CuPy, cuBLAS, PyTorch).

Each line: N calls back to back, one sync at the end, total / N. For calls this small the GPU
is never the bottleneck, so this is the host cost that bounds the step. Run on the device by
benchmarks/gpu_session.sh; the numbers go into benchmarks/NOTES.md.
"""

from __future__ import annotations

import time

import cupy
import numpy as np

from smallem.backends import get_backend
from smallem.backends.cuda.elementwise import elementwise
from smallem.backends.cuda.gemm import _ONE, _ZERO, _cublas

N = 2000


def per_call(label: str, fn, n: int = N) -> None:
    for _ in range(50):
        fn()
    cupy.cuda.get_current_stream().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    cupy.cuda.get_current_stream().synchronize()
    print(f"{label:<52} {1e6 * (time.perf_counter() - t0) / n:7.2f} µs")


def main() -> None:
    be = get_backend("gpu")
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.normal(size=(256, 512)), dtype=cupy.float32)
    w = cupy.asarray(rng.normal(size=(512, 512)), dtype=cupy.float32)
    bias = cupy.asarray(rng.normal(size=512), dtype=cupy.float32)
    out = cupy.empty((256, 512), cupy.float32)
    tanh = elementwise("unary_tanh")
    handle = cupy.cuda.device.get_cublas_handle()
    host_idx = rng.integers(0, 257, size=(256, 16))

    per_call("cupy.empty((256,512), f32)", lambda: cupy.empty((256, 512), cupy.float32))
    per_call("cupy.ndarray((256,512), f32)", lambda: cupy.ndarray((256, 512), cupy.float32))
    per_call("RawKernel tanh, np.int64 size", lambda: tanh((512,), (256,), (x, out, np.int64(x.size))))
    per_call("RawKernel tanh, Python int size", lambda: tanh((512,), (256,), (x, out, x.size)))
    per_call("cupy.tanh(x) (ufunc)", lambda: cupy.tanh(x))
    per_call("backend.tanh(x)", lambda: be.tanh(x))
    per_call("x + bias (ufunc)", lambda: x + bias)
    per_call("backend.add(x, bias)", lambda: be.add(x, bias))
    per_call("x @ w (cupy)", lambda: x @ w)
    per_call("backend.matmul(x, w)", lambda: be.matmul(x, w))
    per_call("backend.matmul(x.T, x)", lambda: be.matmul(x.T, x))
    per_call("cublas.setPointerMode", lambda: _cublas.setPointerMode(handle, 0))
    per_call("cublas.setStream(handle, 0)", lambda: _cublas.setStream(handle, 0))
    per_call("cublas.sgemm into out", lambda: _cublas.sgemm(
        handle, 0, 0, 512, 256, 512, _ONE.ctypes.data, w.data.ptr, 512, x.data.ptr, 512,
        _ZERO.ctypes.data, out.data.ptr, 512))
    per_call("_ONE.ctypes.data", lambda: _ONE.ctypes.data)
    per_call("backend.sum(x, 0)", lambda: be.sum(x, 0))
    per_call("x.sum(0) (cupy)", lambda: x.sum(0))
    per_call("backend.indices((256,16) int64 host)", lambda: be.indices(host_idx))
    per_call("cupy.asarray((256,16) int64 host)", lambda: cupy.asarray(host_idx))
    per_call("backend.full((), 1.0)", lambda: be.full((), 1.0))
    per_call("cupy.zeros((257,32))", lambda: cupy.zeros((257, 32), cupy.float32))
    try:
        import torch
    except ImportError:
        return
    tx = torch.as_tensor(x, device="cuda")
    tw = torch.as_tensor(w, device="cuda")
    per_call("torch.mm(x, w)", lambda: torch.mm(tx, tw))
    per_call("torch.tanh(x)", lambda: torch.tanh(tx))
    per_call("torch x + bias", lambda: tx + tx)


if __name__ == "__main__":
    main()

"""The step's Linear products on one core, by how OpenBLAS is called (issue 38, round 15): is
OpenBLAS's unpacked "direct" sgemm (SkylakeX kernels: row-major, no transposes, alpha 1, beta 0,
M·N·K under 28·512², which every 256-row piece of a Linear's forward is) what makes the pieces
slower than one call, and does beta 1 on C preset to the bias (the packed kernels, the bias in the
same pass) give y = x·W + b's bits?

    python benchmarks/r15_cpu_gemm.py       one JSON line per (shape, product), µs (median of REPS, 40)

Rows: "one" (np.matmul over all 4,096 rows), "pieces" (16 sgemm calls of 256 rows, beta 0, then
+ b: the engine's forward), "pieces beta 1" (C set to b, then 16 calls with beta 1), "torch"
(one thread: F.linear; dx and dW as autograd's mm). "same bits" compares the two piece routes.
Then "engine": the engine's own forward and rule of that Linear on one thread (cpu_linear.py's
smallem_calls: pieces, bias, residual, db and partial sums, the Python around them), in the same
process, to set beside the products alone and the step's Linears (`cpu_step.py ops`).
"""

from __future__ import annotations

import ctypes
import json

import numpy as np
from cpu_linear import median_us, smallem_calls  # benchmarks/: the script's own folder (REPS, 40)
from threadpoolctl import threadpool_limits

from smallem.backends.cpu import compiled_linear

ROWS, PIECE = 4096, 256
SHAPES = [(64, 192), (64, 64), (64, 256), (256, 64), (64, 257)]
RESIDUAL = {(64, 64), (256, 64)}  # the step's Linears that add the residual stream
_I, _F, _P = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
SGEMM = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, _I, _I, _I, _F, _P, _I,
                         _P, _I, _F, _P, _I)(compiled_linear.ADDRESS)


def pieces(x: np.ndarray, w: np.ndarray, y: np.ndarray, beta: float) -> None:
    k, n = w.shape
    for a in range(0, ROWS, PIECE):
        SGEMM(101, 111, 111, PIECE, n, k, 1.0, x[a:].ctypes.data, k, w.ctypes.data, n, beta,
              y[a:].ctypes.data, n)


def main() -> None:
    try:
        import torch
    except ImportError:  # here, without PyTorch: OpenBLAS's rows only
        torch = None
    if torch is not None:
        torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    for k, n in SHAPES:
        x, w = rng.normal(size=(ROWS, k)).astype(np.float32), rng.normal(size=(k, n)).astype(np.float32)
        b, g = rng.normal(size=n).astype(np.float32), rng.normal(size=(ROWS, n)).astype(np.float32)
        y0, y1 = np.empty((ROWS, n), np.float32), np.empty((ROWS, n), np.float32)

        def beta0() -> None:
            pieces(x, w, y0, 0.0)
            y0.__iadd__(b)

        def beta1() -> None:
            y1[:] = b
            pieces(x, w, y1, 1.0)

        beta0(), beta1()
        if torch is not None:
            tx, tw, tb, tg = (torch.from_numpy(a) for a in (x, np.ascontiguousarray(w.T), b, g))
        else:  # the torch rows time nothing
            tx = tw = tb = tg = None
            torch_linear = lambda *a: None  # noqa: E731
        shape = f"{ROWS}x{k} @ {k}x{n}"
        print(json.dumps({
            "shape": shape, "product": "forward", "one": median_us(lambda: np.matmul(x, w) + b),
            "pieces": median_us(beta0), "pieces beta 1": median_us(beta1),
            "torch": median_us(lambda: (torch.nn.functional.linear if torch else torch_linear)(tx, tw, tb)),
            "same bits": bool(np.array_equal(y0, y1)),
            "differ": int(np.count_nonzero(y0 != y1))}), flush=True)
        dx = np.empty((ROWS, k), np.float32)

        def dx_pieces() -> None:
            for a in range(0, ROWS, PIECE):
                np.matmul(g[a:a + PIECE], w.T, out=dx[a:a + PIECE])

        print(json.dumps({
            "shape": shape, "product": "dx, dW", "dx one": median_us(lambda: np.matmul(g, w.T, out=dx)),
            "dx pieces": median_us(dx_pieces), "dx torch": median_us(lambda: torch and tg.mm(tw)),
            "dW one": median_us(lambda: x.T @ g), "dW torch": median_us(lambda: torch and tg.t().mm(tx))}),
            flush=True)
        forward, rule = smallem_calls(k, n, (k, n) in RESIDUAL)
        print(json.dumps({"shape": shape, "product": "engine, one thread", "forward": median_us(forward),
                          "rule": median_us(rule), "residual": (k, n) in RESIDUAL}), flush=True)


if __name__ == "__main__":
    import os

    from smallem.backends import get_backend
    from smallem.backends.cpu import team

    os.environ["SMALLEM_THREADS"] = "1"  # the engine's team settles on one thread
    get_backend("cpu")
    team.resize(1)
    with threadpool_limits(limits=1, user_api="blas"):
        main()

"""Checks and times the cuBLASLt binding (smallem/backends/cuda/tensor_cores.py) on a GPU, standalone.

For each precision: one product against the CPU emulation (precision.round_to, float64 sums),
the bias and GELU+bias epilogues, alpha, a strided batch, a CUDA graph that records and replays
it; then the time of square products against float32 cuBLAS (sgemm), conversions included.
Run: `python benchmarks/precision_lt_check.py` (prints a table; exit 1 on a failed check).
"""

from __future__ import annotations

import sys

import cupy
import numpy as np

from smallem.backends.array import GELU_CUBIC, GELU_SCALE
from smallem.backends.cuda.tensor_cores import Lt
from smallem.backends.precision import round_tf32, round_to


def rel(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def product(lt: Lt, precision: str, a, b, **kw) -> cupy.ndarray:
    """Row-major a (m, k) @ b (k, n) through the column-major library: Dᵀ = Bᵀ·Aᵀ."""
    m, k = a.shape
    n = b.shape[1]
    out = cupy.full((m, n), np.nan, np.float32)  # poisoned: every element must be written
    lt.gemm(precision, 0, 0, n, m, k, b, n, a, k, out, n, **kw)
    return out


def main() -> int:
    lt, rng, failed = Lt(), np.random.default_rng(0), []
    for precision in ("tf32", "bf16", "fp16"):
        m, k, n = 300, 200, 130
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        ra, rb = round_to(a, precision).astype(np.float64), round_to(b, precision).astype(np.float64)
        ref = ra @ rb
        got = product(lt, precision, cupy.asarray(a), cupy.asarray(b)).get()
        e = rel(got, ref)
        line = f"{precision}: plain {e:.2e}"
        if precision == "tf32":  # does the hardware round the inputs, or cut them?
            cut = (a.view(np.uint32) & 0xFFFFE000).view(np.float32).astype(np.float64) @ \
                (b.view(np.uint32) & 0xFFFFE000).view(np.float32).astype(np.float64)
            line += f" (vs round-to-nearest {e:.2e}, vs truncation {rel(got, cut):.2e}," \
                    f" vs float32 {rel(got, a.astype(np.float64) @ b):.2e})"
            assert np.array_equal(round_tf32(a), round_to(a, "tf32"))
        ok = e < 1e-5 or (precision == "tf32" and e < 1e-3)
        biased = product(lt, precision, cupy.asarray(a), cupy.asarray(b), bias=cupy.asarray(bias),
                         epilogue="bias").get()
        eb = rel(biased, ref + bias)
        z = ref + bias
        gelu = 0.5 * z * (1 + np.tanh(GELU_SCALE * (z + GELU_CUBIC * z ** 3)))
        fused = product(lt, precision, cupy.asarray(a), cupy.asarray(b), bias=cupy.asarray(bias),
                        epilogue="gelu_bias").get()
        eg = rel(fused, gelu)
        scaled = product(lt, precision, cupy.asarray(a), cupy.asarray(b), alpha=0.125).get()
        ea = rel(scaled, ref * 0.125)
        # a strided batch of 6 (4·96·64 @ 64·80): attention's shape
        bt, mm, kk, nn = 6, 96, 64, 80
        x = rng.standard_normal((bt, mm, kk)).astype(np.float32)
        y = rng.standard_normal((bt, kk, nn)).astype(np.float32)
        out = cupy.full((bt, mm, nn), np.nan, np.float32)
        lt.gemm(precision, 0, 0, nn, mm, kk, cupy.asarray(y), nn, cupy.asarray(x), kk, out, nn, bt,
                (kk * nn, mm * kk, mm * nn))
        rx, ry = round_to(x, precision).astype(np.float64), round_to(y, precision).astype(np.float64)
        es = rel(out.get(), rx @ ry)
        # captured: recorded once, replayed on new inputs
        da, db = cupy.asarray(a), cupy.asarray(b)
        stream = cupy.cuda.Stream()
        with stream:
            stream.begin_capture()
            graph_out = product(lt, precision, da, db)
            graph = stream.end_capture()
        a2 = rng.standard_normal((m, k)).astype(np.float32)
        da[...] = cupy.asarray(a2)
        graph.launch(stream)
        stream.synchronize()
        ec = rel(graph_out.get(), round_to(a2, precision).astype(np.float64) @ rb)
        tol = 1e-3 if precision == "tf32" else 1e-5
        ok = ok and max(eb, ea, es, ec) < tol and eg < 1e-3
        print(line + f"; bias {eb:.2e}; gelu+bias {eg:.2e}; alpha {ea:.2e}; batched {es:.2e}; "
                     f"graph replay {ec:.2e} -> {'ok' if ok else 'FAILED'}")
        if not ok:
            failed.append(precision)
    print("\nsquare products, ms (median of 20, CUDA events), TFLOP/s; conversions to 16 bits included")
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for size in (512, 2048, 8192):
        a = cupy.asarray(rng.standard_normal((size, size)).astype(np.float32))
        b = cupy.asarray(rng.standard_normal((size, size)).astype(np.float32))
        row = [f"{size:>5}"]
        for precision in ("fp32", "tf32", "bf16", "fp16"):
            times = []
            for _ in range(23):
                start.record()
                if precision == "fp32":
                    a @ b
                else:
                    product(lt, precision, a, b)
                end.record()
                end.synchronize()
                times.append(cupy.cuda.get_elapsed_time(start, end))
            ms = float(np.median(times[3:]))
            row.append(f"{precision} {ms:8.3f} ms {2 * size ** 3 / ms / 1e9:6.1f} TF/s")
        print("  ".join(row))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

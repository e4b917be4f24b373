"""Backprop by hand (notebook 9): the byte MLP's backward written in NumPy, checked piece by piece.

`compare` sets a hand-written gradient beside the tape's and says "✓ exact", "✓ equal to float64
rounding" or "✗ off by ..." (the words the exercise graders use too). The reference rules below
are the ones the lesson derives; the scatter-add part shows why repeated rows need an
accumulating (on a GPU: atomic) add.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...backends.protocol import on_device
from ...errors import fmt
from ..common.graders import off_by  # the graders' words for a difference

ROUNDING = 1e-9  # "equal to float64 rounding": within this fraction of the reference's largest magnitude
WORDS = {"exact": "✓ exact", "rounding": "✓ equal to float64 rounding", "wrong": "✗",
         "wrong shape": "✗ wrong shape", "not done": "… not done"}


@dataclass(frozen=True)
class Comparison:
    """One hand-written tensor against the tape's. `verdict` is "exact", "rounding" (equal to
    float64 rounding), "wrong", "wrong shape" or "not done"; `max_diff` the largest |mine − tape|.
    Printed with the graders' words: "✓ exact", "✓ equal to float64 rounding", "✗ off by ..."."""

    name: str
    verdict: str
    max_diff: float = float("nan")
    where: tuple[int, ...] | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict in ("exact", "rounding")

    def __repr__(self) -> str:
        line = f"{self.name:<16} {WORDS[self.verdict]}"
        if self.verdict == "rounding":
            line += f" (largest difference {fmt(self.max_diff, 2)})"
        if self.verdict == "wrong":
            line += " " + off_by(self.max_diff)
            line += f" at {list(self.where)}" if self.where is not None else ""
        return line + (f": {self.detail}" if self.detail else "")


def compare(name: str, mine: Any, reference: Any, *, tolerance: float = ROUNDING) -> Comparison:
    """Compare `mine` with `reference` (the tape's gradient): exact when every element is
    equal, equal to float64 rounding when the largest difference is under `tolerance` times the
    reference's largest magnitude (the same sums in another order), wrong otherwise."""
    if mine is None or mine is Ellipsis:
        return Comparison(name, "not done", detail="fill in the cell above")
    ref = np.asarray(_host(reference), dtype=np.float64)
    got = np.asarray(_host(mine), dtype=np.float64)
    if got.shape != ref.shape:
        return Comparison(name, "wrong shape",
                          detail=f"yours is {list(got.shape)}, the tape's is {list(ref.shape)}")
    if np.array_equal(got, ref):
        return Comparison(name, "exact", 0.0)
    diff = np.abs(got - ref)
    diff = np.where(np.isnan(diff), np.inf, diff)  # a NaN is as wrong as it gets
    max_diff = float(diff.max())
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    if max_diff <= tolerance * max(scale, np.finfo(np.float64).tiny):
        return Comparison(name, "rounding", max_diff)
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    return Comparison(name, "wrong", max_diff, where)


def _host(x: Any) -> Any:
    return x.get() if on_device(x) else x  # a CuPy array comes to the host


# The reference rules of the lesson, in NumPy ----------------------------------------------

def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, shifted by the row max so exp never overflows."""
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def cross_entropy_grad(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """d mean_cross_entropy / d logits = (softmax(logits) − onehot(targets)) / N."""
    n = logits.shape[0]
    d = softmax(logits)
    d[np.arange(n), targets] -= 1.0
    return d / n


def linear_backward(x: np.ndarray, weight: np.ndarray, dy: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """y = x @ W + b, x (B, I), W (I, O): dx = dy @ Wᵀ (B, I), dW = xᵀ @ dy (I, O),
    db = Σ_rows dy (O,)."""
    return dy @ weight.T, x.T @ dy, dy.sum(axis=0)


def tanh_backward(out: np.ndarray, dout: np.ndarray) -> np.ndarray:
    """c = tanh(a): da = dc · (1 − c²), from the saved output c."""
    return dout * (1.0 - out**2)


def embedding_backward(tokens: np.ndarray, dvectors: np.ndarray, vocab: int) -> np.ndarray:
    """Row t of the table receives the sum of the gradients of every position that read t."""
    dtable = np.zeros((vocab,) + dvectors.shape[tokens.ndim:], dtype=dvectors.dtype)
    np.add.at(dtable, tokens, dvectors)
    return dtable


def layer_norm_dx(xhat: np.ndarray, inv_std: np.ndarray, g: np.ndarray) -> np.ndarray:
    """LayerNorm's input gradient with g = dy·w: dx = (1/σ)(g − mean(g) − x̂·mean(g·x̂))."""
    return inv_std * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))


# Scatter-add: repeated rows --------------------------------------------------------------

def lockstep_scatter_add(rows: np.ndarray, values: np.ndarray, num_rows: int) -> np.ndarray:
    """What one thread per update does without an atomic add, if every thread reads before
    any writes: each reads the old row, adds its own value, writes; the last write wins, and
    every other contribution to that row is lost. (NumPy's `out[rows] += values` is this.)"""
    tail = np.shape(values)[np.ndim(rows):]
    rows = np.asarray(rows).reshape(-1)
    values = np.asarray(values).reshape((rows.size,) + tail)
    out = np.zeros((num_rows,) + values.shape[1:], dtype=values.dtype)
    read = [out[r].copy() for r in rows]  # every thread reads ...
    for r, old, v in zip(rows, read, values):  # ... then every thread writes old + its value
        out[r] = old + v
    return out


def lost_updates(rows: np.ndarray) -> int:
    """How many contributions a last-write-wins scatter loses: all repeats of each row."""
    rows = np.asarray(rows).reshape(-1)
    return int(rows.size - np.unique(rows).size)


_SCATTER_SOURCE = r"""
extern "C" __global__ void scatter_add_plain(const float* values, const long long* rows,
                                             float* out, long long n, long long width) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        float* cell = out + rows[i / width] * width + i % width;
        *cell = *cell + values[i];  // read, add, write: another thread may write in between
    }
}
extern "C" __global__ void scatter_add_atomic(const float* values, const long long* rows,
                                              float* out, long long n, long long width) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        atomicAdd(out + rows[i / width] * width + i % width, values[i]);  // one indivisible step
    }
}
"""


def gpu_scatter_add(rows: np.ndarray, values: np.ndarray, num_rows: int, *, atomic: bool
                    ) -> np.ndarray:
    """out[rows[i]] += values[i] on the GPU, one thread per element, with a plain
    read-add-write (`atomic=False`) or atomicAdd. Needs CuPy and a CUDA device."""
    import cupy

    rows_d = cupy.ascontiguousarray(cupy.asarray(np.asarray(rows).reshape(-1), dtype=cupy.int64))
    vals = cupy.ascontiguousarray(cupy.asarray(values, dtype=cupy.float32)
                                  .reshape(rows_d.size, -1))
    width = vals.shape[1]
    out = cupy.zeros((num_rows, width), dtype=cupy.float32)
    name = "scatter_add_atomic" if atomic else "scatter_add_plain"
    kernel = cupy.RawModule(code=_SCATTER_SOURCE).get_function(name)
    n = vals.size
    threads = 256
    blocks = max(1, min((n + threads - 1) // threads, 65535))
    kernel((blocks,), (threads,), (vals, rows_d, out, np.int64(n), np.int64(width)))
    cupy.cuda.get_current_stream().synchronize()
    return out.get().reshape((num_rows,) + np.shape(values)[np.ndim(rows):])


def scatter_add_race(rows: np.ndarray, num_rows: int, width: int = 32) -> dict[str, Any]:
    """Scatter-add ones (so every cell counts its contributions) with both GPU kernels.
    Returns the expected total, what each kernel kept, and the busiest row's counts."""
    import cupy

    rows = np.asarray(rows).reshape(-1)
    ones = np.ones((rows.size, width), dtype=np.float32)
    expected = np.bincount(rows, minlength=num_rows).astype(np.float64)
    plain = gpu_scatter_add(rows, ones, num_rows, atomic=False).astype(np.float64)
    atomic = gpu_scatter_add(rows, ones, num_rows, atomic=True).astype(np.float64)
    busiest = int(np.argmax(expected))
    return {
        "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "updates": int(rows.size * width),
        "expected_total": float(expected.sum() * width),
        "plain_total": float(plain.sum()),
        "atomic_total": float(atomic.sum()),
        "busiest_row": busiest,
        "busiest_expected": float(expected[busiest]),
        "busiest_plain": float(plain[busiest].mean()),
        "busiest_atomic": float(atomic[busiest].mean()),
        "atomic_exact": bool(np.array_equal(atomic, np.repeat(expected[:, None], width, 1))),
    }


# What `scatter_add_race` returned on a GPU, for readers without one: notebook 09's batch on an
# NVIDIA H200 (benchmarks/scatter_race.py; the plain kernel's total varies from run to run,
# 3,680 here and 3,424 in another: how many updates a race loses is itself a race).
RECORDED_SCATTER_RACE: dict[str, Any] | None = {
    "device": "NVIDIA H200", "updates": 131072, "expected_total": 131072.0,
    "plain_total": 3680.0, "atomic_total": 131072.0, "busiest_row": 32,
    "busiest_expected": 1208.0, "busiest_plain": 1.0, "busiest_atomic": 1208.0,
    "atomic_exact": True,
}

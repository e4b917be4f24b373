"""The fused cross-entropy on the GPU: the mean loss in one launch (two over many rows), and
its rule d logits = (softmax − onehot)·grad/N in one.

operations.CrossEntropy's forward and rule stay the truth; tests/gpu/test_fused_operations.py
compares them. In bf16 or fp16 the rule writes d logits' 16-bit copy too (the head's backward
products read it).
"""

from __future__ import annotations

from typing import Any

from . import halves
from .common import F32, HEADER, _empty, fast, kernel, warps
from .reductions import mean_of

MANY_ROWS = 2048  # above this, the loss takes a warp per row and a mean

SOURCE = HEADER + halves.HALF + r"""
// One row of logits, read by the 32 lanes of a warp: its max m and s = sum of exp(x − m),
// the same in every lane. Subtracting the max keeps exp finite for logits of ±1e4.
__device__ __forceinline__ void row_max_sum(const float* x, int classes, int lane, float* m,
                                            float* s) {
    float mx = NEG_INF;
    for (int j = lane; j < classes; j += 32) mx = fmaxf(mx, x[j]);
    mx = warp_max(mx);
    float sum = 0.f;
    for (int j = lane; j < classes; j += 32) sum += expf(x[j] - mx);
    *m = mx;
    *s = warp_sum(sum);
}

// loss = mean over rows of logsumexp(x) − x[target]. One block: each warp takes rows in turn
// (max, then the sum of exponentials, both across its 32 lanes), then the warps' sums are
// added in a fixed order. One launch, no atomics, no zeroing.
extern "C" __global__ void cross_entropy_forward(const float* logits, const long long* targets,
                                                 float* loss, long long n_rows,
                                                 long long n_classes) {
    int rows = (int)n_rows, classes = (int)n_classes;
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float acc = 0.f;
    for (int r = warp; r < rows; r += warps) {
        const float* x = logits + (long long)r * classes;
        float m, s;
        row_max_sum(x, classes, lane, &m, &s);
        acc += m + logf(s) - x[targets[r]];  // the same in every lane: lane 0's copy is kept
    }
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        float v = lane < warps ? partial[lane] : 0.f;
        v = warp_sum(v);
        if (lane == 0) *loss = v / rows;
    }
}

// Many rows (a Transformer's B·T): one warp per row writes its loss, then mean_of adds them
// in a fixed order. One block for all rows (above) would leave the GPU nearly idle.
extern "C" __global__ void cross_entropy_rows(const float* logits, const long long* targets,
                                              float* row_loss, long long rows,
                                              long long n_classes) {
    int classes = (int)n_classes;
    int lane = threadIdx.x & 31;
    long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) return;
    const float* x = logits + r * classes;
    float m, s;
    row_max_sum(x, classes, lane, &m, &s);
    if (lane == 0) row_loss[r] = m + logf(s) - x[targets[r]];
}

// d logits = (softmax(x) − onehot(target)) · grad / rows, one warp per row.
extern "C" __global__ void cross_entropy_backward(const float* logits, const long long* targets,
                                                  const float* grad, float* out,
                                                  long long rows, long long n_classes,
                                                  unsigned short* h, int fp16) {
    int classes = (int)n_classes;
    int lane = threadIdx.x & 31;
    long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) return;  // whole warps leave together: the shuffles below stay full
    const float* x = logits + r * classes;
    float* y = out + r * classes;
    float m, s;
    row_max_sum(x, classes, lane, &m, &s);
    float scale = grad[0] / rows, inv = 1.f / s;
    long long t = targets[r];
    for (int j = lane; j < classes; j += 32) {
        float d = (expf(x[j] - m) * inv - (j == t ? 1.f : 0.f)) * scale;
        y[j] = d;
        put_half(h, r * classes + j, d, fp16);
    }
}
"""


def _rows_classes(logits: Any) -> tuple[int, int]:
    classes = logits.shape[-1] if logits.ndim else 0
    return (logits.size // classes if classes else 0), classes


def cross_entropy_forward(be: Any, logits: Any, op: Any) -> Any:
    """fused_forward["cross_entropy"]: the mean loss in one launch (declines what the kernel
    cannot read, and the reference forward runs)."""
    rows, classes = _rows_classes(logits)
    if not (fast(logits) and rows):
        return None
    loss = _empty((), F32)
    if rows <= MANY_ROWS:  # the MLP's batch: one block, one launch
        kernel(SOURCE, "cross_entropy_forward")((1,), (1024,), (
            logits, op.target_index(be), loss, rows, classes))
        return loss
    row_loss = _empty((rows,), F32)
    kernel(SOURCE, "cross_entropy_rows")(*warps(rows), (logits, op.target_index(be), row_loss,
                                                         rows, classes))
    mean_of(row_loss, loss, rows)
    return loss


def cross_entropy_rule(be: Any, grad: Any, out: Any, logits: Any, op: Any) -> tuple | None:
    """fused["cross_entropy"]: d logits = (softmax − onehot)·grad/N in one launch, one warp per
    row. operations.CrossEntropy's rule stays the truth; tests compare the two."""
    rows, classes = _rows_classes(logits)
    if not (fast(logits) and fast(grad) and rows):
        return None
    dx = _empty(logits.shape, F32)
    kernel(SOURCE, "cross_entropy_backward")(*warps(rows), (
        logits, op.target_index(be), grad, dx, rows, classes,
        halves.output_copy(dx, be.precision), halves.fp16_flag(be.precision)))
    return (dx,)


"""The fused attention on the tensor cores, for bf16 and fp16 runs (backends/precision.py): the
float32 kernels' algorithm (attention.py) with its matrix products as mma.sync m16n8k16.

q, k, v and dO are rounded to the format once, by a pass that also lays out the transposes the
products read (what the precision policy says a matrix product reads); scores, softmax statistics
and every accumulator stay float32, and P and dS are rounded as the next product reads them.
A warp owns 16 rows; forward and dQ walk key tiles, dK and dV walk query tiles, no atomics.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .attention_mma_tiles import PRELUDE  # the defines, pack and mma both kernels use
from .attention_tc_grad import KERNELS_BACKWARD
from .common import HEADER, _empty, kernel

WIDTHS = (16, 32, 64, 128)  # head widths (a multiple of the product's k = 16)
FORMATS = ("bf16", "fp16")
ROWS = 64  # the rows a block owns: 4 warps of 16
THREADS = 128


def other_rows(d: int) -> int:
    """Rows of the tile a block walks (keys or queries): fewer at width 128, for registers."""
    return 32 if d > 64 else 64


def shared_bytes(kind: str, d: int) -> int:
    """Dynamic shared memory of a block: its own rows and the walked tile, 16-bit numbers in
    rows padded by 8 (so a warp's fragment reads fall in 32 different banks)."""
    n, rows, cols = other_rows(d), d + 8, other_rows(d) + 8
    halves = {"forward": ROWS * rows + n * rows + d * cols,   # Q; K; Vᵀ
              "query": 2 * ROWS * rows + 2 * n * rows + d * cols,   # Q, dO; K, V; Kᵀ
              "key": 2 * ROWS * rows + 2 * n * rows + 2 * d * cols}[kind]  # K, V; Q, dO; Qᵀ, dOᵀ
    return 2 * halves + (8 * n if kind == "key" else 0)  # and the tile's lse, δ


KERNELS = PRELUDE + r"""
__device__ __forceinline__ unsigned word(const half_t* p) { return *(const unsigned*)p; }

// C (16 × 8·NT) += A · Bᵀ: A's 16 rows from row `r0` of a [·][pitch] tile, K = 16·KC columns;
// B's rows (C's columns) from a [·][bpitch] tile. g = lane / 4, t = lane % 4 (PTX's names).
template <int F16, int KC, int NT> __device__ __forceinline__ void mma_abt(
        float (*c)[4], const half_t* a, int pitch, int r0, const half_t* bt, int bpitch) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
        const half_t* ap = a + (r0 + g) * pitch + kc * 16 + t * 2;
        unsigned f[4] = {word(ap), word(ap + 8 * pitch), word(ap + 8), word(ap + 8 * pitch + 8)};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const half_t* bp = bt + (nt * 8 + g) * bpitch + kc * 16 + t * 2;
            mma<F16>(c[nt], f, word(bp), word(bp + 8));
        }
    }
}
// C (16 × 8·NT) += P · Bᵀ with P (16 × 8·PT) in registers as float32 accumulators (rounded to
// the format here): an accumulator pair (n-tiles 2kc, 2kc + 1) is an A fragment as it stands.
template <int F16, int PT, int NT> __device__ __forceinline__ void mma_pbt(
        float (*c)[4], float (*p)[4], const half_t* bt, int bpitch) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int kc = 0; kc < PT / 2; ++kc) {
        unsigned f[4] = {pack<F16>(p[2 * kc][0], p[2 * kc][1]), pack<F16>(p[2 * kc][2], p[2 * kc][3]),
                         pack<F16>(p[2 * kc + 1][0], p[2 * kc + 1][1]),
                         pack<F16>(p[2 * kc + 1][2], p[2 * kc + 1][3])};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const half_t* bp = bt + (nt * 8 + g) * bpitch + kc * 16 + t * 2;
            mma<F16>(c[nt], f, word(bp), word(bp + 8));
        }
    }
}
// n rows of a (·, HD) array from row `first` into a [n][HD + 8] tile, 16 bytes a copy.
template <int HD> __device__ __forceinline__ void copy_rows(half_t* dst, const half_t* src,
                                                           int first, int n) {
    for (int i = threadIdx.x; i < n * (HD / 8); i += blockDim.x) {
        int j = i / (HD / 8), c = (i % (HD / 8)) * 8;
        *(uint4*)(dst + j * (HD + 8) + c) = *(const uint4*)(src + (long long)(first + j) * HD + c);
    }
}
// Columns first .. first + n of a (HD, width) array into a [HD][n + 8] tile.
template <int HD> __device__ __forceinline__ void copy_cols(half_t* dst, const half_t* src,
                                                           int width, int first, int n) {
    for (int i = threadIdx.x; i < HD * (n / 8); i += blockDim.x) {
        int d = i / (n / 8), c = (i % (n / 8)) * 8;
        *(uint4*)(dst + d * (n + 8) + c) = *(const uint4*)(src + (long long)d * width + first + c);
    }
}
// x (float32, strided) once in the format, per head: rows (Tp, HD) and/or transposed (HD, Tp),
// Tp = T rounded up to 64 with zeros, so the kernels copy whole tiles. Grid (Tp / 32, B·H).
#define TC_CONVERT_ARGS const float* x, STRIDES(sx), half_t* rows, half_t* cols, int want_rows, \
        int want_cols, int heads, int T, int Tp
template <int F16, int HD> __device__ __forceinline__ void to_format(TC_CONVERT_ARGS) {
    S_(sx);
    __shared__ float tile[32][HD + 1];
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, t0 = blockIdx.x * 32;
    for (int i = threadIdx.x; i < 32 * HD; i += blockDim.x) {
        int j = i / HD, d = i % HD;
        tile[j][d] = t0 + j < T ? row_at(x, sx, b, h, t0 + j)[d] : 0.f;
    }
    __syncthreads();
    for (int i = threadIdx.x; want_rows && i < 16 * HD; i += blockDim.x) {
        int j = i / (HD / 2), d = (i % (HD / 2)) * 2;
        *(unsigned*)(rows + ((long long)bh * Tp + t0 + j) * HD + d) = pack<F16>(tile[j][d], tile[j][d + 1]);
    }
    for (int i = threadIdx.x; want_cols && i < 16 * HD; i += blockDim.x) {
        int d = i / 16, j = (i % 16) * 2;
        *(unsigned*)(cols + ((long long)bh * HD + d) * Tp + t0 + j) = pack<F16>(tile[j][d], tile[j + 1][d]);
    }
}
__device__ __forceinline__ float quad_max(float x) {  // over the 4 threads of a row (same g)
    x = fmaxf(x, __shfl_xor_sync(FULL, x, 1));
    return fmaxf(x, __shfl_xor_sync(FULL, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(FULL, x, 1);
    return x + __shfl_xor_sync(FULL, x, 2);
}

#define TC_FORWARD_ARGS const half_t* q, const half_t* k, const half_t* vt, float* o, float* lse, \
        STRIDES(so), int heads, int T, int S, int Tp, int Sp, float scale, int causal
// O by the online softmax: each warp 16 query rows (its S tile and O in registers), the block's
// Q and the walked K, Vᵀ tiles in shared memory. Grid (query tiles, B·H), longest rows first.
template <int F16, int HD, int N> __device__ __forceinline__ void tc_forward(TC_FORWARD_ARGS) {
    enum { M = 64, NT = N / 8, DT = HD / 8, KC = HD / 16, P = HD + 8 };
    S_(so);
    extern __shared__ __align__(16) half_t smem[];
    half_t *qs = smem, *ks = qs + M * P, *vts = ks + N * P;
    int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    int tile = gridDim.x - 1 - blockIdx.x, q0 = tile * M, warp = threadIdx.x >> 5;
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16;
    float c = scale * LOG2E, m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f}, acc[DT][4];
#pragma unroll
    for (int i = 0; i < DT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    copy_rows<HD>(qs, q + (long long)bh * Tp * HD, q0, M);
    int last = causal ? min(S, q0 + M) : S;
    for (int j0 = 0; j0 < last; j0 += N) {
        __syncthreads();
        copy_rows<HD>(ks, k + (long long)bh * Sp * HD, j0, N);
        copy_cols<HD>(vts, vt + (long long)bh * HD * Sp, Sp, j0, N);
        __syncthreads();
        float s[NT][4];
#pragma unroll
        for (int i = 0; i < NT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
        mma_abt<F16, KC, NT>(s, qs, P, r0, ks, P);
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int key = j0 + i * 8 + t * 2 + (e & 1), row = q0 + r0 + g + (e >> 1) * 8;
                s[i][e] = (key >= S || (causal && key > row)) ? NEG_INF : s[i][e] * c;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[i][e]);
            }
        float base[2], alpha[2];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            float mn = fmaxf(m[x], quad_max(mx[x]));
            base[x] = mn == NEG_INF ? 0.f : mn;  // a row with no key yet: its p are all 0
            alpha[x] = exp2f(m[x] - base[x]);
            m[x] = mn;
            l[x] *= alpha[x];
        }
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[i][e] = exp2f(s[i][e] - base[e >> 1]);
                l[e >> 1] += s[i][e];  // this thread's part of the row sum; summed at the end
            }
#pragma unroll
        for (int i = 0; i < DT; ++i) {
            acc[i][0] *= alpha[0]; acc[i][1] *= alpha[0]; acc[i][2] *= alpha[1]; acc[i][3] *= alpha[1];
        }
        mma_pbt<F16, NT, DT>(acc, s, vts, N + 8);
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        int row = q0 + r0 + g + x * 8;
        float sum = quad_sum(l[x]);
        if (row >= T) continue;
        float inv = 1.f / sum, *op = (float*)row_at(o, so, b, h, row);
#pragma unroll
        for (int i = 0; i < DT; ++i)
            *(float2*)(op + i * 8 + t * 2) = make_float2(acc[i][2 * x] * inv, acc[i][2 * x + 1] * inv);
        if (t == 0) lse[(long long)bh * T + row] = (m[x] + log2f(sum)) * LN2;
    }
}
"""



@cache
def source() -> str:
    """Every kernel: flash_tc_<kind>_<format>_<width>, kind convert (into the format), forward,
    query (dQ), key (dK, dV)."""
    fwd = "q, k, vt, o, lse, sob, soh, sot, heads, T, S, Tp, Sp, scale, causal"
    grad = ("q, qt, k, kt, v, g, gt, lse, delta, dx, dy, sdxb, sdxh, sdxt, sdyb, sdyh, sdyt, heads, "
            "T, S, Tp, Sp, scale, causal")
    conv = "x, sxb, sxh, sxt, rows, cols, want_rows, want_cols, heads, T, Tp"
    out = [HEADER, KERNELS, KERNELS_BACKWARD]
    for fmt in FORMATS:
        for d in WIDTHS:
            f16, n = int(fmt == "fp16"), other_rows(d)
            out.append(f'extern "C" __global__ void flash_tc_convert_{fmt}_{d}(TC_CONVERT_ARGS) '
                       f"{{ to_format<{f16}, {d}>({conv}); }}\n")
            out.append(f'extern "C" __global__ void flash_tc_forward_{fmt}_{d}(TC_FORWARD_ARGS) '
                       f"{{ tc_forward<{f16}, {d}, {n}>({fwd}); }}\n")
            for kind in ("query", "key"):
                out.append(f'extern "C" __global__ void flash_tc_{kind}_{fmt}_{d}(TC_GRAD_ARGS) '
                           f"{{ tc_{kind}<{f16}, {d}, {n}>({grad}); }}\n")
    return "".join(out)


_READY: set[tuple[str, str, int]] = set()
U16 = np.dtype(np.uint16)  # a bf16 or fp16 number's bits (CuPy has no bf16 dtype)


def tc_kernel(kind: str, fmt: str, d: int) -> Any:
    """The kernel, allowed the dynamic shared memory it takes (past the 48 KiB default)."""
    fn = kernel(source(), f"flash_tc_{kind}_{fmt}_{d}")
    if kind != "convert" and (kind, fmt, d) not in _READY:
        fn.max_dynamic_shared_size_bytes = shared_bytes(kind, d)
        _READY.add((kind, fmt, d))
    return fn


def strides(x: Any) -> tuple:
    """(b, h, t) strides in floats of a (B, H, T, D) or (N, T, D) array (N: B with one head)."""
    s = [st // 4 for st in x.strides[:-1]]
    return tuple(np.int64(v) for v in ((s[0], 0, s[1]) if len(x.shape) == 3 else s))


def padded(n: int) -> int:
    """Rows the converted copies hold: n rounded up to 64 (every tile is whole)."""
    return (n + 63) // 64 * 64


def to_format(x: Any, fmt: str, heads: tuple[int, int], rows: bool, cols: bool) -> tuple:
    """x's values in `fmt`, per head as rows (Tp, D) and/or transposed (D, Tp), zeros past T:
    one pass, so the attention kernels copy 16-bit tiles instead of rounding them again each
    time a block reads them."""
    (batch, h), t, d = heads, x.shape[-2], x.shape[-1]
    tp = padded(t)
    made = [_empty((batch * h * tp * d,), U16) if want else None for want in (rows, cols)]
    dummy = next(m for m in made if m is not None)  # an unused pointer still needs a buffer
    tc_kernel("convert", fmt, d)((tp // 32, batch * h), (256,), (
        x, *strides(x), made[0] if rows else dummy, made[1] if cols else dummy, np.int32(rows),
        np.int32(cols), np.int32(h), np.int32(t), np.int32(tp)))
    return made[0], made[1]


def forward(q: Any, k: Any, v: Any, out: Any, lse: Any, fmt: str, heads: tuple[int, int],
            scale: float, causal: bool) -> None:
    """O and lse into `out`, `lse` (float32) from q, k, v (float32) read in `fmt`."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    qr, _ = to_format(q, fmt, heads, True, False)
    kr, _ = to_format(k, fmt, heads, True, False)
    _, vt = to_format(v, fmt, heads, False, True)
    tc_kernel("forward", fmt, d)(((t + ROWS - 1) // ROWS, batch * h), (THREADS,), (
        qr, kr, vt, out, lse, *strides(out), np.int32(h), np.int32(t), np.int32(s),
        np.int32(padded(t)), np.int32(padded(s)), np.float32(scale), np.int32(causal)),
        shared_mem=shared_bytes("forward", d))


def backward(q: Any, k: Any, v: Any, grad: Any, lse: Any, delta: Any, grads: tuple, fmt: str,
             heads: tuple[int, int], scale: float, causal: bool) -> None:
    """dK, dV then dQ into `grads` (dq, dk, dv; float32), δ computed (attention.py)."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    dq, dk, dv = grads
    qr, qt = to_format(q, fmt, heads, True, True)
    kr, kt = to_format(k, fmt, heads, True, True)
    vr, _ = to_format(v, fmt, heads, True, False)
    gr, gt = to_format(grad, fmt, heads, True, True)
    tail = (np.int32(h), np.int32(t), np.int32(s), np.int32(padded(t)), np.int32(padded(s)),
            np.float32(scale), np.int32(causal))
    common = (qr, qt, kr, kt, vr, gr, gt, lse, delta)
    tc_kernel("key", fmt, d)(((s + ROWS - 1) // ROWS, batch * h), (THREADS,),
                             (*common, dk, dv, *strides(dk), *strides(dv), *tail),
                             shared_mem=shared_bytes("key", d))
    tc_kernel("query", fmt, d)(((t + ROWS - 1) // ROWS, batch * h), (THREADS,),
                               (*common, dq, dq, *strides(dq), *strides(dq), *tail),
                               shared_mem=shared_bytes("query", d))

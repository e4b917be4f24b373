"""The fused attention on the tensor cores, second version (round 7, issue 37): FlashAttention-2's
layout on mma.sync m16n8k16 for bf16 and fp16 runs. attention.py picks it (or round 6's
attention_tc.py) by `attention.TENSOR_CORES`; the backward kernels are in attention_mma_grad.py.

What changed from attention_tc.py: every fragment is read by ldmatrix (.trans where a product
reads a tile transposed, so no transposed copy is made), the walked K/V (or Q/dO) tiles are
copied by cp.async into a second buffer while the tensor cores work on the first, a block's own
rows are read from the float32 inputs directly (rounded once, as they land in shared memory),
only the causal diagonal and the last tiles are masked, and a warp whose rows see none of a tile's
keys skips it. The fragments, copies and products they share are in attention_mma_tiles.py.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .attention_mma_grad import KERNELS_BACKWARD
from .attention_mma_tiles import TILES
from .attention_tc import FORMATS, U16, WIDTHS, padded, strides
from .common import HEADER, _empty, kernel

__all__ = ["FORMATS", "WIDTHS", "CONFIG", "source", "forward", "backward", "shared_bytes"]

# kind -> width -> (warps, rows of the walked tile[, the forward's m-tiles of 16 rows a warp]):
# forward, dQ (query), dK/dV (key; keyq takes key's). 8 warps at D 64 and 128: timed in round 7's
# first call (results/round7/attention_call1_variants.log), 10-15 % faster than 4 there; 2 m-tiles slower.
CONFIG = {"forward": {16: (4, 64, 1), 32: (4, 64, 1), 64: (8, 64, 1), 128: (8, 64, 1)},
          "query": {16: (4, 64), 32: (4, 64), 64: (4, 64), 128: (4, 32)},
          "key": {16: (4, 64), 32: (4, 64), 64: (8, 64), 128: (8, 32)}}
# dQ by atomics inside the key kernel (FlashAttention-2's backward, 5 products) or by its own pass
# over key tiles (7 products, no atomics: the result does not depend on the order of additions)
DQ_BY_ATOMICS = True


def shared_bytes(kind: str, d: int, config: dict | None = None) -> int:
    """A block's dynamic shared memory: its own rows (Q; Q, dO; K, V), two buffers of the walked
    tiles (K, V; K, V; Q, dO) in 16-bit numbers, rows padded by 8; the key kernels' lse, δ, and
    keyq's dSᵀ tile."""
    w, n, *mt = (config or CONFIG)["key" if kind == "keyq" else kind][d]
    own = (mt[0] if kind == "forward" else 2) * 16 * w
    extra = {"key": 16 * n, "keyq": 16 * n + 2 * 16 * w * (n + 8)}.get(kind, 0)  # + keyq's dSᵀ
    return 2 * (own + 4 * n) * (d + 8) + extra


KERNELS = r"""
#define MMA_FORWARD_ARGS const float* q, const half_t* k, const half_t* v, float* o, float* lse, \
        STRIDES(sq), STRIDES(so), int heads, int T, int S, int Tp, int Sp, float scale, int causal
// O by the online softmax: each warp MT·16 query rows (their S tiles and O in registers; each
// K or V fragment read from shared memory feeds MT products), the block's Q and two buffers of
// K, V tiles in shared memory. Grid (query blocks, B·H), longest rows first.
template <int F16, int HD, int N, int W, int MT>
__device__ __forceinline__ void mma_forward(MMA_FORWARD_ARGS) {
    enum { M = 16 * W * MT, NTH = 32 * W, NT = N / 8, DT = HD / 8, KC = HD / 16, P = HD + 8 };
    S_(sq); S_(so);
    extern __shared__ __align__(16) half_t smem[];
    half_t *qs = smem, *kv = qs + M * P;  // kv: two buffers of [K tile; V tile]
    int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    int q0 = (gridDim.x - 1 - blockIdx.x) * M, warp = threadIdx.x >> 5;
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16 * MT, w0 = q0 + r0;
    const half_t *kb = k + (long long)bh * Sp * HD, *vb = v + (long long)bh * Sp * HD;
    int tiles = ((causal ? min(S, q0 + M) : S) + N - 1) / N;
    tile_async<HD, NTH>(kv, kb, N);
    tile_async<HD, NTH>(kv + N * P, vb, N);
    cp_commit();
    own_rows<F16, HD, NTH>(qs, q, sq, b, h, q0, M, T);
    float c = scale * LOG2E, m[MT][2], l[MT][2], acc[MT][DT][4];
#pragma unroll
    for (int u = 0; u < MT; ++u) {
        m[u][0] = m[u][1] = NEG_INF;
        l[u][0] = l[u][1] = 0.f;
#pragma unroll
        for (int i = 0; i < DT; ++i) acc[u][i][0] = acc[u][i][1] = acc[u][i][2] = acc[u][i][3] = 0.f;
    }
    for (int j = 0; j < tiles; ++j) {
        if (j + 1 < tiles) {  // the next tile lands while this one is multiplied
            half_t* nx = kv + ((j + 1) & 1) * 2 * N * P;
            tile_async<HD, NTH>(nx, kb + (long long)(j + 1) * N * HD, N);
            tile_async<HD, NTH>(nx + N * P, vb + (long long)(j + 1) * N * HD, N);
        }
        cp_commit();
        cp_wait_one();
        __syncthreads();
        const half_t *ks = kv + (j & 1) * 2 * N * P, *vs = ks + N * P;
        int j0 = j * N;
        if (!causal || j0 <= w0 + 16 * MT - 1) {  // else none of this warp's rows sees these keys
            float s[MT][NT][4];
#pragma unroll
            for (int u = 0; u < MT; ++u)
#pragma unroll
                for (int i = 0; i < NT; ++i) s[u][i][0] = s[u][i][1] = s[u][i][2] = s[u][i][3] = 0.f;
#pragma unroll
            for (int kc = 0; kc < KC; ++kc) {  // S = Q Kᵀ
                unsigned f[MT][4];
#pragma unroll
                for (int u = 0; u < MT; ++u) frag_a(f[u], qs, P, r0 + 16 * u, kc * 16);
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    unsigned w[4];
                    frag_b(w, ks, P, np * 16, kc * 16);
#pragma unroll
                    for (int u = 0; u < MT; ++u) {
                        mma<F16>(s[u][2 * np], f[u], w[0], w[1]);
                        mma<F16>(s[u][2 * np + 1], f[u], w[2], w[3]);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < MT; ++u) {
                int u0 = w0 + 16 * u;  // this m-tile's first row
                if (j0 + N > S || (causal && j0 + N - 1 > u0)) {  // the diagonal or the last keys
#pragma unroll
                    for (int i = 0; i < NT; ++i)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            int key = j0 + i * 8 + t * 2 + (e & 1), row = u0 + g + (e >> 1) * 8;
                            if (key >= S || (causal && key > row)) s[u][i][e] = NEG_INF;
                        }
                }
                float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
                for (int i = 0; i < NT; ++i) {
                    mx[0] = fmaxf(mx[0], fmaxf(s[u][i][0], s[u][i][1]));
                    mx[1] = fmaxf(mx[1], fmaxf(s[u][i][2], s[u][i][3]));
                }
                float base[2], alpha[2];
#pragma unroll
                for (int x = 0; x < 2; ++x) {
                    float mn = fmaxf(m[u][x], quad_max(mx[x]) * c);
                    base[x] = mn == NEG_INF ? 0.f : mn;  // a row with no key yet: its p are all 0
                    alpha[x] = ex2(m[u][x] - base[x]);
                    m[u][x] = mn;
                    l[u][x] *= alpha[x];
                }
#pragma unroll
                for (int i = 0; i < NT; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[u][i][e] = ex2(fmaf(s[u][i][e], c, -base[e >> 1]));
                        l[u][e >> 1] += s[u][i][e];  // this thread's part of the row sum
                    }
#pragma unroll
                for (int i = 0; i < DT; ++i) {
                    acc[u][i][0] *= alpha[0]; acc[u][i][1] *= alpha[0];
                    acc[u][i][2] *= alpha[1]; acc[u][i][3] *= alpha[1];
                }
            }
#pragma unroll
            for (int kc = 0; kc < NT / 2; ++kc) {  // O += P V, P rounded as it is read
                unsigned f[MT][4];
#pragma unroll
                for (int u = 0; u < MT; ++u) {
                    f[u][0] = pack<F16>(s[u][2 * kc][0], s[u][2 * kc][1]);
                    f[u][1] = pack<F16>(s[u][2 * kc][2], s[u][2 * kc][3]);
                    f[u][2] = pack<F16>(s[u][2 * kc + 1][0], s[u][2 * kc + 1][1]);
                    f[u][3] = pack<F16>(s[u][2 * kc + 1][2], s[u][2 * kc + 1][3]);
                }
#pragma unroll
                for (int np = 0; np < DT / 2; ++np) {
                    unsigned w[4];
                    frag_bt(w, vs, P, kc * 16, np * 16);
#pragma unroll
                    for (int u = 0; u < MT; ++u) {
                        mma<F16>(acc[u][2 * np], f[u], w[0], w[1]);
                        mma<F16>(acc[u][2 * np + 1], f[u], w[2], w[3]);
                    }
                }
            }
        }
        __syncthreads();  // before the next copy overwrites this buffer
    }
#pragma unroll
    for (int u = 0; u < MT; ++u)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            int row = w0 + 16 * u + g + x * 8;
            float sum = quad_sum(l[u][x]);
            if (row >= T) continue;
            float inv = 1.f / sum, *op = (float*)row_at(o, so, b, h, row);
#pragma unroll
            for (int i = 0; i < DT; ++i)
                *(float2*)(op + i * 8 + t * 2) = make_float2(acc[u][i][2 * x] * inv,
                                                             acc[u][i][2 * x + 1] * inv);
            if (t == 0) lse[(long long)bh * T + row] = (m[u][x] + log2f(sum)) * LN2;
        }
}
"""


@cache
def _source(config_key: tuple) -> str:
    config = {kind: dict(widths) for kind, widths in config_key}
    fwd = "q, k, v, o, lse, sqb, sqh, sqt, sob, soh, sot, heads, T, S, Tp, Sp, scale, causal"
    grad = ("q, k, v, g, qr, kr, vr, gr, lse, delta, dx, dy, dz, sqb, sqh, sqt, skb, skh, skt, svb, svh, "
            "svt, sgb, sgh, sgt, sdxb, sdxh, sdxt, sdyb, sdyh, sdyt, sdzb, sdzh, sdzt, heads, T, S, Tp, Sp, "
            "scale, causal")
    conv = "x, sxb, sxh, sxt, out, heads, T, Tp, o, sob, soh, sot, delta, zero, szb, szh, szt"
    out = [HEADER, TILES, KERNELS, KERNELS_BACKWARD]
    for fmt in FORMATS:
        for d in WIDTHS:
            f16 = int(fmt == "fp16")
            out.append(f'extern "C" __global__ void flash_mma_convert_{fmt}_{d}(MMA_CONVERT_ARGS) '
                       f"{{ to_rows<{f16}, {d}>({conv}); }}\n")
            w, n, mt = config["forward"][d]
            out.append(f'extern "C" __global__ void flash_mma_forward_{fmt}_{d}(MMA_FORWARD_ARGS) '
                       f"{{ mma_forward<{f16}, {d}, {n}, {w}, {mt}>({fwd}); }}\n")
            w, n = config["query"][d]
            out.append(f'extern "C" __global__ void flash_mma_query_{fmt}_{d}(MMA_GRAD_ARGS) '
                       f"{{ mma_query<{f16}, {d}, {n}, {w}>({grad}); }}\n")
            w, n = config["key"][d]
            for kind, dq in (("key", 0), ("keyq", 1)):
                out.append(f'extern "C" __global__ void flash_mma_{kind}_{fmt}_{d}(MMA_GRAD_ARGS) '
                           f"{{ mma_key<{f16}, {d}, {n}, {w}, {dq}>({grad}); }}\n")
    return "".join(out)


def source(config: dict | None = None) -> str:
    """Every kernel: flash_mma_<kind>_<format>_<width>, kind convert (rows in the format),
    forward, query (dQ), key (dK, dV), keyq (dK, dV and dQ by atomics); `config` (CONFIG's
    shape) for a bench's variants."""
    config = config or CONFIG
    return _source(tuple((kind, tuple(sorted(w.items()))) for kind, w in config.items()))


_READY: set[tuple] = set()


def mma_kernel(kind: str, fmt: str, d: int) -> Any:
    """The kernel, allowed the dynamic shared memory it takes (past the 48 KiB default)."""
    fn = kernel(source(), f"flash_mma_{kind}_{fmt}_{d}")
    if kind != "convert" and (fn, kind, d) not in _READY:
        fn.max_dynamic_shared_size_bytes = shared_bytes(kind, d)
        _READY.add((fn, kind, d))
    return fn


def to_rows(x: Any, fmt: str, heads: tuple[int, int], o: Any = None, delta: Any = None,
            zero: Any = None) -> Any:
    """x's values in `fmt`, per head as rows (Tp, D), zeros past T: the tiles the kernels walk
    are then whole and 16-byte aligned for cp.async. With o (x = dO): δ = rowsum(dO ⊙ O) too;
    with zero (an array of x's shape): zeros into it, in the same pass."""
    (batch, h), t, d = heads, x.shape[-2], x.shape[-1]
    tp = padded(t)
    out = _empty((batch * h * tp * d,), U16)
    with_o = (0, 0, 0, 0, 0) if o is None else (o, *strides(o), delta)  # 0: a null pointer
    with_zero = (0, 0, 0, 0) if zero is None else (zero, *strides(zero))
    mma_kernel("convert", fmt, d)(((tp * d // 8 + 255) // 256, batch * h), (256,), (
        x, *strides(x), out, np.int32(h), np.int32(t), np.int32(tp), *with_o, *with_zero))
    return out


def _blocks(kind: str, d: int, n: int) -> tuple[int, int]:
    """(blocks over n own rows, threads a block)."""
    w, _, *mt = CONFIG["key" if kind == "keyq" else kind][d]
    rows = 16 * w * (mt[0] if mt else 1)
    return (n + rows - 1) // rows, 32 * w


def forward(q: Any, k: Any, v: Any, out: Any, lse: Any, fmt: str, heads: tuple[int, int],
            scale: float, causal: bool) -> None:
    """O and lse into `out`, `lse` (float32) from q, k, v (float32) read in `fmt`."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    kr, vr = to_rows(k, fmt, heads), to_rows(v, fmt, heads)
    blocks, threads = _blocks("forward", d, t)
    mma_kernel("forward", fmt, d)((blocks, batch * h), (threads,), (
        q, kr, vr, out, lse, *strides(q), *strides(out), np.int32(h), np.int32(t), np.int32(s),
        np.int32(padded(t)), np.int32(padded(s)), np.float32(scale), np.int32(causal)),
        shared_mem=shared_bytes("forward", d))


def backward(q: Any, k: Any, v: Any, grad: Any, lse: Any, delta: Any, grads: tuple, fmt: str,
             heads: tuple[int, int], scale: float, causal: bool, out: Any = None) -> None:
    """dK, dV and dQ into `grads` (dq, dk, dv; float32). δ into `delta`, by dO's convert, when
    `out` (O) is given; else computed before (attention.py)."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    dq, dk, dv = grads
    atomics = DQ_BY_ATOMICS
    walked = (q, grad) if atomics else (q, k, v, grad)  # the tiles some kernel walks
    extra = {id(grad): {"o": out, "delta": delta}, id(q): {"zero": dq} if atomics else {}}
    made = {id(x): to_rows(x, fmt, heads, **extra.get(id(x), {})) for x in walked}
    rows = [made.get(id(x), made[id(q)]) for x in (q, k, v, grad)]  # an unread slot: any buffer
    tail = (np.int32(h), np.int32(t), np.int32(s), np.int32(padded(t)), np.int32(padded(s)),
            np.float32(scale), np.int32(causal))
    common = (q, k, v, grad, *rows, lse, delta)
    ins = tuple(n for x in (q, k, v, grad) for n in strides(x))
    outs = (dk, dv, dq, *strides(dk), *strides(dv), *strides(dq))
    kind = "keyq" if atomics else "key"
    blocks, threads = _blocks(kind, d, s)
    mma_kernel(kind, fmt, d)((blocks, batch * h), (threads,), (*common, *_grad_args(outs, ins, tail)),
                             shared_mem=shared_bytes(kind, d))
    if not atomics:
        blocks, threads = _blocks("query", d, t)
        mma_kernel("query", fmt, d)((blocks, batch * h), (threads,), (*common, *_grad_args(
            (dq, dq, dq, *strides(dq), *strides(dq), *strides(dq)), ins, tail)),
            shared_mem=shared_bytes("query", d))


def _grad_args(outs: tuple, ins: tuple, tail: tuple) -> tuple:
    """MMA_GRAD_ARGS after lse, δ: dx, dy, dz, the inputs' strides, the outputs' strides, tail."""
    return (*outs[:3], *ins, *outs[3:], *tail)

"""The fused attention on the tensor cores, second version (round 7, issue 37): FlashAttention-2's
layout on mma.sync m16n8k16 for bf16 and fp16 runs. attention.py picks it (or round 6's
attention_tc.py) by `attention.TENSOR_CORES`; the backward kernels are in attention_mma_grad.py.

What changed from attention_tc.py: every fragment is read by ldmatrix (.trans where a product
reads a tile transposed, so no transposed copy is made), the walked K/V (or Q/dO) tiles are
copied by cp.async into a second buffer while the tensor cores work on the first, a block's own
rows are read from the float32 inputs directly (rounded once, as they land in shared memory),
only the causal diagonal and the last tiles are masked, and a warp whose rows see none of a tile's
keys skips it. The fragments, copies and products they share are in attention_mma_tiles.py.
Round 8: the kernels write the 16-bit copies of O, dK, dV (and dQ) that the Linears read
(halves.py), and may read the float32 tiles they walk themselves (CONFIG["staged"]).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from . import halves
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
          "key": {16: (4, 64), 32: (4, 64), 64: (8, 64), 128: (8, 32)},
          # (forward, key kernels): 1 where the kernel reads the float32 tiles it walks itself
          # (K, V; Q) through a float32 stage in shared memory, 0 where a convert launch first
          # rounds them into 16-bit rows (round 7's way). Staged was faster only in the key kernel
          # at D 32 (8-9 %), 3-32 % slower elsewhere (results/round8/attention/, variants).
          "staged": {16: (0, 0), 32: (0, 1), 64: (0, 0), 128: (0, 0)}}
# dQ by atomics inside the key kernel (FlashAttention-2's backward, 5 products) or by its own pass
# over key tiles (7 products, no atomics: the result does not depend on the order of additions)
DQ_BY_ATOMICS = True
# The kernels write 16-bit copies of O, dQ, dK, dV beside the float32 ones and register them
# (halves.py): the Linears that read them then round nothing in launches of their own.
COPIES = True
# With dQ by atomics: dQ's copy written by the key kernel (the last key block to add to a query
# tile writes it, after one fence a block: right to the bit on the H200, but the longest key block
# is last on nearly every tile and copies them alone; backward 1.233 / 2.646 ms at D 64, T 1,024 /
# 4,096 against 0.961 / 2.429 with no copies, results/round8/attention/), or (False) made by the
# Linear reading dQ: one launch a block, a pass over dQ at memory speed.
DQ_COPY = False


def shared_bytes(kind: str, d: int, config: dict | None = None) -> int:
    """A block's dynamic shared memory: its own rows (Q; Q, dO; K, V), two buffers of the walked
    tiles (K, V; K, V; Q, dO) in 16-bit numbers, rows padded by 8; the key kernels' lse, δ, and
    keyq's dSᵀ tile. Staged: the float32 stage (K, V forward, in one 16-bit buffer; Q backward)."""
    config = config or CONFIG
    w, n, *mt = config["key" if kind == "keyq" else kind][d]
    own = (mt[0] if kind == "forward" else 2) * 16 * w
    extra = {"key": 16 * n, "keyq": 16 * n + 2 * 16 * w * (n + 8)}.get(kind, 0)  # + keyq's dSᵀ
    forward_staged, key_staged = config["staged"][d]
    if kind == "forward" and forward_staged:
        return 2 * (own + 2 * n) * (d + 8) + 2 * n * d * 4
    return 2 * (own + 4 * n) * (d + 8) + extra + (n * d * 4 if kind != "query" and key_staged else 0)


KERNELS = r"""
#define MMA_FORWARD_ARGS const float* q, const float* k, const float* v, const half_t* kr, \
        const half_t* vr, float* o, half_t* oh, float* lse, STRIDES(sq), STRIDES(sk), STRIDES(sv), \
        STRIDES(so), int heads, int T, int S, int Tp, int Sp, float scale, int causal
// O by the online softmax: each warp MT·16 query rows (their S tiles and O in registers; each
// K or V fragment read from shared memory feeds MT products), the block's Q and two buffers of
// K, V tiles in shared memory. Grid (query blocks, B·H), longest rows first.
// ST = 0: K, V walked in 16-bit rows (kr, vr: their converts). ST = 1 (round 8): read from the
// float32 k, v by cp.async into a float32 stage while the tensor cores work, then rounded into
// one 16-bit buffer: no convert launch. oh (not null): O's 16-bit copy, at O's offsets.
template <int F16, int HD, int N, int W, int MT, int ST>
__device__ __forceinline__ void mma_forward(MMA_FORWARD_ARGS) {
    enum { M = 16 * W * MT, NTH = 32 * W, NT = N / 8, DT = HD / 8, KC = HD / 16, P = HD + 8 };
    S_(sq); S_(sk); S_(sv); S_(so);
    extern __shared__ __align__(16) half_t smem[];
    half_t *qs = smem, *kv = qs + M * P;  // kv: two buffers of [K tile; V tile] (ST: one)
    float* st = (float*)(kv + 2 * N * P);  // ST: the float32 stage [K tile; V tile], rows of HD
    int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    int q0 = (gridDim.x - 1 - blockIdx.x) * M, warp = threadIdx.x >> 5;
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, r0 = warp * 16 * MT, w0 = q0 + r0;
    const half_t *kb = kr + (long long)bh * Sp * HD, *vb = vr + (long long)bh * Sp * HD;
    int tiles = ((causal ? min(S, q0 + M) : S) + N - 1) / N;
    if (ST) {
        stage_async<HD, NTH>(st, k, sk, b, h, 0, N, S);
        stage_async<HD, NTH>(st + N * HD, v, sv, b, h, 0, N, S);
    } else {
        tile_async<HD, NTH>(kv, kb, N);
        tile_async<HD, NTH>(kv + N * P, vb, N);
    }
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
        if (ST) {  // tile j is in the stage: rounded into the buffer, then tile j + 1 fetched
            cp_wait_all();
            __syncthreads();  // every thread's copies landed, every warp done with tile j - 1
            stage_round<F16, HD, NTH>(kv, st, N);
            stage_round<F16, HD, NTH>(kv + N * P, st + N * HD, N);
            __syncthreads();  // the buffer written, the stage read
            if (j + 1 < tiles) {  // lands while this tile is multiplied
                stage_async<HD, NTH>(st, k, sk, b, h, (j + 1) * N, N, S);
                stage_async<HD, NTH>(st + N * HD, v, sv, b, h, (j + 1) * N, N, S);
            }
            cp_commit();
        } else {
            if (j + 1 < tiles) {  // the next tile lands while this one is multiplied
                half_t* nx = kv + ((j + 1) & 1) * 2 * N * P;
                tile_async<HD, NTH>(nx, kb + (long long)(j + 1) * N * HD, N);
                tile_async<HD, NTH>(nx + N * P, vb + (long long)(j + 1) * N * HD, N);
            }
            cp_commit();
            cp_wait_one();
            __syncthreads();
        }
        const half_t *ks = kv + (ST ? 0 : (j & 1) * 2 * N * P), *vs = ks + N * P;
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
        if (!ST) __syncthreads();  // before the next copy overwrites this buffer
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
            for (int i = 0; i < DT; ++i) {
                float lo = acc[u][i][2 * x] * inv, hi = acc[u][i][2 * x + 1] * inv;
                *(float2*)(op + i * 8 + t * 2) = make_float2(lo, hi);
                put_pair<F16>(oh, op + i * 8 + t * 2, o, lo, hi);
            }
            if (t == 0) lse[(long long)bh * T + row] = (m[u][x] + log2f(sum)) * LN2;
        }
}
"""


@cache
def _source(config_key: tuple) -> str:
    config = {kind: dict(widths) for kind, widths in config_key}
    fwd = ("q, k, v, kr, vr, o, oh, lse, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, "
           "heads, T, S, Tp, Sp, scale, causal")
    grad = ("q, k, v, g, qr, kr, vr, gr, lse, delta, dx, dy, dz, hx, hy, hz, counts, sqb, sqh, sqt, "
            "skb, skh, skt, svb, svh, "
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
            forward_staged, key_staged = config["staged"][d]
            # two blocks a multiprocessor at D 64 (at most 128 registers): the stage and O's copy
            # took the forward to 134, one block (nvcc -Xptxas -v, round 8)
            bounds = f"__launch_bounds__({32 * w}, 2) " if d == 64 else ""
            out.append(f'extern "C" __global__ {bounds}void flash_mma_forward_{fmt}_{d}(MMA_FORWARD_ARGS) '
                       f"{{ mma_forward<{f16}, {d}, {n}, {w}, {mt}, {forward_staged}>({fwd}); }}\n")
            w, n = config["query"][d]
            out.append(f'extern "C" __global__ void flash_mma_query_{fmt}_{d}(MMA_GRAD_ARGS) '
                       f"{{ mma_query<{f16}, {d}, {n}, {w}>({grad}); }}\n")
            w, n = config["key"][d]
            for kind, dq in (("key", 0), ("keyq", 1)):
                out.append(f'extern "C" __global__ void flash_mma_{kind}_{fmt}_{d}(MMA_GRAD_ARGS) '
                           f"{{ mma_key<{f16}, {d}, {n}, {w}, {dq}, {key_staged}>({grad}); }}\n")
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


def _copy(x: Any, fmt: str) -> Any:
    """What a kernel gets for its output x: a 16-bit array laid out as x's memory (x a heads view
    of a (B, T, H, D) array, or plain), registered in halves as the copy of that memory, or the
    null pointer (COPIES off, or x not at the start of its memory)."""
    base = x if x.base is None else x.base
    if not COPIES or base.data.ptr != x.data.ptr or base.size != x.size or not base.flags.c_contiguous:
        return halves.NO_COPY
    half = _empty(base.shape, U16)
    halves.register(base, half, fmt)
    return half


def _zeros(x: Any) -> None:
    """x's memory (x a view of a contiguous array, or one) zeroed in one memset on the stream."""
    base = x if x.base is None else x.base
    base.data.memset_async(0, base.nbytes)


def forward(q: Any, k: Any, v: Any, out: Any, lse: Any, fmt: str, heads: tuple[int, int],
            scale: float, causal: bool) -> None:
    """O and lse into `out`, `lse` (float32) from q, k, v (float32) read in `fmt`; O's 16-bit
    copy registered (COPIES). Staged (CONFIG): K, V read by the kernel, no convert."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    staged = CONFIG["staged"][d][0]
    kr, vr = (0, 0) if staged else (to_rows(k, fmt, heads), to_rows(v, fmt, heads))
    blocks, threads = _blocks("forward", d, t)
    mma_kernel("forward", fmt, d)((blocks, batch * h), (threads,), (
        q, k, v, kr, vr, out, _copy(out, fmt), lse, *strides(q), *strides(k), *strides(v), *strides(out),
        np.int32(h), np.int32(t), np.int32(s), np.int32(padded(t)), np.int32(padded(s)),
        np.float32(scale), np.int32(causal)), shared_mem=shared_bytes("forward", d))


def backward(q: Any, k: Any, v: Any, grad: Any, lse: Any, delta: Any, grads: tuple, fmt: str,
             heads: tuple[int, int], scale: float, causal: bool, out: Any = None) -> None:
    """dK, dV and dQ into `grads` (dq, dk, dv; float32), their 16-bit copies registered
    (COPIES). δ into `delta`, by dO's convert, when `out` (O) is given; else computed before
    (attention.py). Staged (CONFIG): Q read by the key kernel, no convert for it."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    dq, dk, dv = grads
    atomics, staged = DQ_BY_ATOMICS, CONFIG["staged"][d][1]
    # the tiles some kernel walks in 16-bit rows: dO always (its convert computes δ)
    walked = ((() if staged else (q,)) + (grad,)) if atomics else ((() if staged else (q,)) + (k, v, grad))
    zero_by_q = atomics and not staged  # dQ (added to by atomics) zeroed by Q's convert, or a memset
    extra = {id(grad): {"o": out, "delta": delta}, id(q): {"zero": dq} if zero_by_q else {}}
    made = {id(x): to_rows(x, fmt, heads, **extra.get(id(x), {})) for x in walked}
    rows = [made.get(id(x), made[id(grad)]) for x in (q, k, v, grad)]  # an unread slot: any buffer
    if atomics and staged:
        _zeros(dq)
    hq = _copy(dq, fmt) if DQ_COPY or not atomics else halves.NO_COPY  # none that nobody writes
    hk, hv = _copy(dk, fmt), _copy(dv, fmt)
    counts = halves.NO_COPY
    if atomics and hq is not halves.NO_COPY:  # per (B·H, query tile): the key blocks that added
        counts = _empty((batch * h * -(-t // CONFIG["key"][d][1]),), np.uint32)
        counts.data.memset_async(0, counts.nbytes)
    tail = (np.int32(h), np.int32(t), np.int32(s), np.int32(padded(t)), np.int32(padded(s)),
            np.float32(scale), np.int32(causal))
    common = (q, k, v, grad, *rows, lse, delta)
    ins = tuple(n for x in (q, k, v, grad) for n in strides(x))
    outs = (dk, dv, dq, hk, hv, hq if atomics else halves.NO_COPY, counts,
            *strides(dk), *strides(dv), *strides(dq))
    kind = "keyq" if atomics else "key"
    blocks, threads = _blocks(kind, d, s)
    mma_kernel(kind, fmt, d)((blocks, batch * h), (threads,), (*common, *_grad_args(outs, ins, tail)),
                             shared_mem=shared_bytes(kind, d))
    if not atomics:
        blocks, threads = _blocks("query", d, t)
        mma_kernel("query", fmt, d)((blocks, batch * h), (threads,), (*common, *_grad_args(
            (dq, dq, dq, hq, 0, 0, 0, *strides(dq), *strides(dq), *strides(dq)), ins, tail)),
            shared_mem=shared_bytes("query", d))


def _grad_args(outs: tuple, ins: tuple, tail: tuple) -> tuple:
    """MMA_GRAD_ARGS after lse, δ: dx, dy, dz, their copies, counts, the inputs' strides, the
    outputs' strides, tail."""
    return (*outs[:7], *ins, *outs[7:], *tail)

"""The CUDA source of the float32 row kernels (attention.py builds and launches them): the online
softmax a query row at a time forward; δ, then dK and dV a key row at a time, then dQ a query row
at a time backward. G threads share a row; what a thread holds stays in registers.
"""

KERNELS = r"""
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define FULL 0xffffffffu
struct Strides { long long b, h, t; };  // in floats; the last dimension is contiguous
#define STRIDES(n) long long n##b, long long n##h, long long n##t
#define S_(n) Strides n = {n##b, n##h, n##t}
__device__ __forceinline__ const float4* row4(const float* x, Strides s, int b, int h, int t) {
    return (const float4*)(x + b * s.b + h * s.h + (long long)t * s.t);
}
__device__ __forceinline__ float4* row4w(float* x, Strides s, int b, int h, int t) {
    return (float4*)(x + b * s.b + h * s.h + (long long)t * s.t);
}
__device__ __forceinline__ void fma4(float4* y, float4 a, float4 b) {  // y += a ⊙ b, 4 chains
    y->x = fmaf(a.x, b.x, y->x); y->y = fmaf(a.y, b.y, y->y);
    y->z = fmaf(a.z, b.z, y->z); y->w = fmaf(a.w, b.w, y->w);
}
__device__ __forceinline__ void axpy4(float4* y, float a, float4 x) {
    y->x = fmaf(a, x.x, y->x); y->y = fmaf(a, x.y, y->y);
    y->z = fmaf(a, x.z, y->z); y->w = fmaf(a, x.w, y->w);
}
__device__ __forceinline__ float4 scale4(float4 x, float a) {
    return make_float4(x.x * a, x.y * a, x.z * a, x.w * a);
}
__device__ __forceinline__ float hsum(float4 x) { return (x.x + x.y) + (x.z + x.w); }
// G threads share a row: lanes l, l ^ 32/G, ... (the same l % (32/G)) of one warp.
template <int G> __device__ __forceinline__ float row_sum(float x) {
#pragma unroll
    for (int o = 16; o >= 32 / G; o >>= 1) x += __shfl_xor_sync(FULL, x, o);
    return x;
}
// The thread's row in the block and its part: it holds float4s part, part + G, part + 2G, ...
// of the row (interleaved, so the G parts of a shared-memory row sit in different banks).
template <int G> __device__ __forceinline__ void slot(int* r, int* part) {
    int lane = threadIdx.x & 31, rows = 32 / G;
    *r = (threadIdx.x >> 5) * rows + lane % rows;
    *part = lane / rows;
}
// Rows of a shared tile: 64 at most, 32 KiB of K and V (or Q and dO) at any width.
template <int HD> struct Tile { enum { D4 = HD / 4, N = 4096 / HD < 64 ? 4096 / HD : 64 }; };
template <int HD> __device__ __forceinline__ void load_tiles(
        float4 (*a)[HD / 4], float4 (*c)[HD / 4], const float* x, Strides sx, const float* y,
        Strides sy, int b, int h, int first, int rows, int last) {
    for (int i = threadIdx.x; i < rows * (HD / 4); i += blockDim.x) {
        int j = i / (HD / 4), d = i % (HD / 4), t = min(first + j, last);
        a[j][d] = row4(x, sx, b, h, t)[d];
        c[j][d] = row4(y, sy, b, h, t)[d];
    }
}

// O = softmax(q kᵀ·scale) v by the online softmax: ROWS query rows a block, G threads a row
// (q and the output accumulator in registers), key tiles in shared memory read by all rows;
// lse = m + log l per row. Grid (query tiles, B·H), the longest causal rows first.
#define FORWARD_ARGS const float* q, const float* k, const float* v, float* o, float* lse, \
        STRIDES(sq), STRIDES(sk), STRIDES(sv), STRIDES(so), int heads, int T, int S, float scale, \
        int causal
template <int HD, int G, int ROWS> __device__ __forceinline__ void forward(FORWARD_ARGS) {
    enum { D4 = HD / 4, P4 = D4 / G, KT = Tile<HD>::N };
    S_(sq); S_(sk); S_(sv); S_(so);
    __shared__ float4 ks[KT][D4], vs[KT][D4];
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, r, part;
    slot<G>(&r, &part);
    int tile = gridDim.x - 1 - blockIdx.x, row = tile * ROWS + r;
    float c = scale * LOG2E;  // scores in base 2: exp2f is one instruction
    float4 qr[P4], acc[P4];
    const float4* qp = row4(q, sq, b, h, min(row, T - 1));
#pragma unroll
    for (int d = 0; d < P4; ++d) {
        qr[d] = scale4(qp[d * G + part], c);
        acc[d] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m = NEG_INF, l = 0.f;
    int last = causal ? min(S, (tile + 1) * ROWS) : S;
    for (int j0 = 0; j0 < last; j0 += KT) {
        __syncthreads();
        load_tiles<HD>(ks, vs, k, sk, v, sv, b, h, j0, KT, S - 1);
        __syncthreads();
        for (int jc = 0; jc < KT && j0 + jc < last; jc += 16) {  // the same for the whole block
            float s[16], cm = NEG_INF;
#pragma unroll
            for (int u = 0; u < 16; ++u) {
                int key = j0 + jc + u;
                float4 x4 = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int d = 0; d < P4; ++d) fma4(&x4, qr[d], ks[jc + u][d * G + part]);
                float x = row_sum<G>(hsum(x4));
                s[u] = (key >= S || (causal && key > row)) ? NEG_INF : x;
                cm = fmaxf(cm, s[u]);
            }
            float mn = fmaxf(m, cm);
            if (mn != NEG_INF) {  // else every key so far is masked: nothing to add yet
                float alpha = exp2f(m - mn);  // m = −∞ the first time: alpha = 0
                l *= alpha;
#pragma unroll
                for (int d = 0; d < P4; ++d) acc[d] = scale4(acc[d], alpha);
#pragma unroll
                for (int u = 0; u < 16; ++u) {
                    float p = exp2f(s[u] - mn);
                    l += p;
#pragma unroll
                    for (int d = 0; d < P4; ++d) axpy4(&acc[d], p, vs[jc + u][d * G + part]);
                }
                m = mn;
            }
        }
    }
    if (row >= T) return;
    float inv = 1.f / l;
    float4* op = row4w(o, so, b, h, row);
#pragma unroll
    for (int d = 0; d < P4; ++d) op[d * G + part] = scale4(acc[d], inv);
    if (part == 0) lse[(long long)bh * T + row] = (m + log2f(l)) * LN2;
}

// The backward as FlashAttention-2's, in three launches. δ_i = rowsum(dO_i ⊙ O_i) first, a
// thread a row. Then dK, dV: ROWS key rows a block, each (G threads) holding k_j, v_j, dK_j, dV_j
// in registers, walking the query tiles that see it: p = exp(q·k·s − lse), dV += p dO,
// ds = p (dO·v − δ), dK += ds q·s. Then dQ the same way round: q_i, dO_i, dQ_i in registers,
// walking the key tiles: dQ += ds k·s. No atomics: each gradient row has one owner.
#define DELTA_ARGS const float* o, const float* g, float* delta, STRIDES(so), STRIDES(sg), \
        int heads, int T, int rows
template <int HD> __device__ __forceinline__ void row_delta(DELTA_ARGS) {
    S_(so); S_(sg);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    int t = i % T, bh = i / T, b = bh / heads, h = bh % heads;
    const float4 *op = row4(o, so, b, h, t), *gp = row4(g, sg, b, h, t);
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int d = 0; d < HD / 4; ++d) fma4(&x, op[d], gp[d]);
    delta[i] = hsum(x);
}

#define GRAD_ARGS const float* q, const float* k, const float* v, const float* g, \
        const float* lse, const float* delta, float* dx, float* dy, STRIDES(sq), STRIDES(sk), \
        STRIDES(sv), STRIDES(sg), STRIDES(sdx), STRIDES(sdy), int heads, int T, int S, \
        float scale, int causal
template <int HD, int G, int ROWS> __device__ __forceinline__ void key_grads(GRAD_ARGS) {
    enum { D4 = HD / 4, P4 = D4 / G, QT = Tile<HD>::N };
    S_(sq); S_(sk); S_(sv); S_(sg); S_(sdx); S_(sdy);
    __shared__ float4 qs[QT][D4], gs[QT][D4];
    __shared__ float ls[QT], ds[QT];
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, r, part;
    slot<G>(&r, &part);
    int j0 = blockIdx.x * ROWS, key = j0 + r, kj = min(key, S - 1);
    float c = scale * LOG2E;
    float4 kr[P4], vr[P4], dk[P4], dv[P4];
    const float4 *kp = row4(k, sk, b, h, kj), *vp = row4(v, sv, b, h, kj);
#pragma unroll
    for (int d = 0; d < P4; ++d) {
        kr[d] = scale4(kp[d * G + part], c);
        vr[d] = vp[d * G + part];
        dk[d] = dv[d] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const float* lrow = lse + (long long)bh * T;
    const float* drow = delta + (long long)bh * T;
    for (int i0 = causal ? (j0 / QT) * QT : 0; i0 < T; i0 += QT) {
        __syncthreads();
        load_tiles<HD>(qs, gs, q, sq, g, sg, b, h, i0, QT, T - 1);
        if (threadIdx.x < QT) {  // rows past T: lse = +∞ makes their p 0, δ = 0 their ds
            int qi = i0 + threadIdx.x;
            ls[threadIdx.x] = qi < T ? lrow[qi] * LOG2E : __int_as_float(0x7f800000);
            ds[threadIdx.x] = qi < T ? drow[qi] : 0.f;
        }
        __syncthreads();
        int n = min(QT, T - i0);
#pragma unroll 2
        for (int rr = 0; rr < n; ++rr) {
            float4 x4 = make_float4(0.f, 0.f, 0.f, 0.f), p4 = x4;
#pragma unroll
            for (int d = 0; d < P4; ++d) {
                fma4(&x4, qs[rr][d * G + part], kr[d]);
                fma4(&p4, gs[rr][d * G + part], vr[d]);
            }
            float x = row_sum<G>(hsum(x4)), dp = row_sum<G>(hsum(p4));
            float p = (causal && key > i0 + rr) ? 0.f : exp2f(x - ls[rr]);
            float dsr = p * (dp - ds[rr]);
#pragma unroll
            for (int d = 0; d < P4; ++d) {
                axpy4(&dv[d], p, gs[rr][d * G + part]);
                axpy4(&dk[d], dsr, qs[rr][d * G + part]);
            }
        }
    }
    if (key >= S) return;
    float4 *dkp = row4w(dx, sdx, b, h, key), *dvp = row4w(dy, sdy, b, h, key);
#pragma unroll
    for (int d = 0; d < P4; ++d) {
        dkp[d * G + part] = scale4(dk[d], scale);
        dvp[d * G + part] = dv[d];
    }
}

template <int HD, int G, int ROWS> __device__ __forceinline__ void query_grads(GRAD_ARGS) {
    enum { D4 = HD / 4, P4 = D4 / G, KT = Tile<HD>::N };
    S_(sq); S_(sk); S_(sv); S_(sg); S_(sdx);
    __shared__ float4 ks[KT][D4], vs[KT][D4];
    int bh = blockIdx.y, b = bh / heads, h = bh % heads, r, part;
    slot<G>(&r, &part);
    int tile = gridDim.x - 1 - blockIdx.x, row = tile * ROWS + r, qi = min(row, T - 1);
    float c = scale * LOG2E;
    float4 qr[P4], gr[P4], dq[P4];
    const float4 *qp = row4(q, sq, b, h, qi), *gp = row4(g, sg, b, h, qi);
#pragma unroll
    for (int d = 0; d < P4; ++d) {
        qr[d] = scale4(qp[d * G + part], c);
        gr[d] = gp[d * G + part];
        dq[d] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float l2 = lse[(long long)bh * T + qi] * LOG2E, dl = delta[(long long)bh * T + qi];
    int last = causal ? min(S, (tile + 1) * ROWS) : S;
    for (int j0 = 0; j0 < last; j0 += KT) {
        __syncthreads();
        load_tiles<HD>(ks, vs, k, sk, v, sv, b, h, j0, KT, S - 1);
        __syncthreads();
        int n = min(KT, last - j0);
#pragma unroll 2
        for (int j = 0; j < n; ++j) {
            float4 x4 = make_float4(0.f, 0.f, 0.f, 0.f), p4 = x4;
#pragma unroll
            for (int d = 0; d < P4; ++d) {
                fma4(&x4, qr[d], ks[j][d * G + part]);
                fma4(&p4, gr[d], vs[j][d * G + part]);
            }
            float x = row_sum<G>(hsum(x4)), dp = row_sum<G>(hsum(p4));
            float p = (causal && j0 + j > row) ? 0.f : exp2f(x - l2);
            float dsr = p * (dp - dl);
#pragma unroll
            for (int d = 0; d < P4; ++d) axpy4(&dq[d], dsr, ks[j][d * G + part]);
        }
    }
    if (row >= T) return;
    float4* dqp = row4w(dx, sdx, b, h, row);
#pragma unroll
    for (int d = 0; d < P4; ++d) dqp[d * G + part] = scale4(dq[d], scale);
}
"""

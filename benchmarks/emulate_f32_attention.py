"""The float32 flash attention's CUDA source (backends/cuda/attention_f32.py) run on the CPU: each
block's threads as std::threads (barriers for __syncthreads and the warps' shuffles, cp.async as
plain copies), compiled by g++ -std=c++20, checked against the float64 reference. A check of the
indexing before a device call, not of speed:
`python benchmarks/emulate_f32_attention.py` (a few minutes on two cores).
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from smallem.backends.cuda import attention_f32

PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
#include <memory>
struct U3 { unsigned x, y, z; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
thread_local U3 threadIdx, blockIdx;
thread_local int t_lane, t_warp;
U3 blockDim, gridDim;
float* g_smem;
struct Warp { std::barrier<> bar{32}; float v[32]; };
std::barrier<>* g_block;
Warp* g_warps;
static inline void __syncthreads() { g_block->arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned, float x, int o) {
    Warp& w = g_warps[t_warp];
    w.v[t_lane] = x;
    w.bar.arrive_and_wait();
    float r = w.v[t_lane ^ o];
    w.bar.arrive_and_wait();
    return r;
}
static inline float4 atomicAdd(float4* p, float4 v) {  // blocks run one at a time
    float4 old = *p;
    p->x += v.x; p->y += v.y; p->z += v.z; p->w += v.w;
    return old;
}
template <class F> void run_grid(int gx, int gy, int nt, int smem, F f) {
    std::vector<float> buf(smem / 4 + 4);
    gridDim = {(unsigned)gx, (unsigned)gy, 1}; blockDim = {(unsigned)nt, 1, 1};
    for (int by = 0; by < gy; ++by)
        for (int bx = 0; bx < gx; ++bx) {
            std::fill(buf.begin(), buf.end(), NAN);  // unwritten shared memory reads as NaN
            g_smem = buf.data();
            std::barrier<> block(nt);
            g_block = &block;
            std::unique_ptr<Warp[]> warps(new Warp[nt / 32]);
            g_warps = warps.get();
            std::vector<std::thread> threads;
            for (int t = 0; t < nt; ++t)
                threads.emplace_back([=] {
                    threadIdx = {(unsigned)t, 0, 0}; blockIdx = {(unsigned)bx, (unsigned)by, 0};
                    t_lane = t % 32; t_warp = t / 32;
                    f();
                });
            for (auto& th : threads) th.join();
        }
}
"""

SHIMS = {  # device-only lines and their CPU stand-ins
    r'asm volatile\("cp\.async\.cg\.shared\.global \[%0\], \[%1\], 16;" :: "r"\(d\), "l"\(src\)\);':
        "std::memcpy(dst, src, 16);",
    r'asm volatile\("cp\.async\.ca\.shared\.global \[%0\], \[%1\], 4;" :: "r"\(d\), "l"\(src\)\);':
        "std::memcpy(dst, src, 4);",
    r"unsigned d = \(unsigned\)__cvta_generic_to_shared\(dst\);": "",
    r'asm volatile\("cp\.async\.commit_group;"\);': "",
    r'asm volatile\("cp\.async\.wait_group %0;" :: "n"\(N\) : "memory"\);': "",
    r"extern __shared__ __align__\(16\) float smem\[\];": "float* smem = g_smem;",
    r'extern "C" __global__ void __launch_bounds__\(\d+(, \d+)?\)': "static void",
    r'extern "C" __global__ void': "static void",
    r"__device__ __forceinline__": "static inline",
    r"__device__": "",
}

S3 = "long long {0}b, long long {0}h, long long {0}t"


def launchers(d: int) -> str:
    """extern "C" entry points run_<kind>(grid, block, shared bytes, the kernel's arguments)."""
    fwd = ["const float* q", "const float* k", "const float* v", "float* o", "float* lse",
           *(S3.format(n) for n in ("sq", "sk", "sv", "so")), "int heads", "int T", "int S",
           "float scale", "int causal"]
    grad = ["const float* q", "const float* k", "const float* v", "const float* g",
            "const float* lse", "const float* delta", "float* dq", "float* dk", "float* dv",
            *(S3.format(n) for n in ("sq", "sk", "sv", "sg", "sdq", "sdk", "sdv")), "int heads",
            "int T", "int S", "float scale", "int causal"]
    delta = ["const float* o", "const float* g", "float* delta", "float* dq",
             *(S3.format(n) for n in ("so", "sg", "sz")), "int heads", "int T", "int rows"]
    out = []
    for kind, params in (("forward", fwd), ("backward", grad), ("delta", delta)):
        names = ", ".join(re.split(r"[ *]", p)[-1] if "long long" not in p else
                          ", ".join(x.split()[-1] for x in p.split(", ")) for p in params)
        out.append(f'extern "C" void run_{kind}_{d}(int gx, int gy, int nt, int smem, '
                   f'{", ".join(params)}) {{ run_grid(gx, gy, nt, smem, [=] {{ '
                   f"flash32_{kind}_{d}({names}); }}); }}\n")
    return "".join(out)


def build(config: dict, tmp: Path) -> ctypes.CDLL:
    src = attention_f32.source(config)
    for pattern, repl in SHIMS.items():
        src = re.sub(pattern, repl, src)
    path = tmp / "emu.cpp"
    path.write_text(PRELUDE + src + "".join(launchers(d) for d in config))
    lib = tmp / "emu.so"
    subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-w", str(path), "-o",
                    str(lib), "-pthread"], check=True)
    return ctypes.CDLL(str(lib))


def reference(q, k, v, g, causal):
    """float64: O, lse, dQ, dK, dV (B, H, T, D)."""
    d = q.shape[-1]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(d)
    if causal:
        s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
    mx = s.max(-1, keepdims=True)
    p = np.exp(s - mx)
    lse = (mx + np.log(p.sum(-1, keepdims=True)))[..., 0]
    p /= p.sum(-1, keepdims=True)
    o = p @ v
    ds = p * (g @ v.swapaxes(-1, -2) - (g * o).sum(-1, keepdims=True)) / np.sqrt(d)
    return o, lse, ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ g


def heads_view(x):
    """x (B, H, T, D) laid out (B, T, H, D) in memory, as the Transformer's heads are."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3), dtype=np.float32).transpose(0, 2, 1, 3)


def strides(x) -> list:
    s = [st // 4 for st in x.strides[:-1]]
    return [ctypes.c_longlong(n) for n in s]


def check(lib, config, b, h, t, s, d, causal, seed=0, shared: dict | None = None) -> list[float]:
    """O, lse, dQ, dK, dV's errors; `shared`: each kind's shared bytes, where not config's tiles'
    (emulate_f32_tc.py's kernels)."""
    shared = shared or {kind: attention_f32.shared_bytes(kind, d, config)
                        for kind in ("forward", "backward")}
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, h, t, d))
    k, v = rng.normal(size=(b, h, s, d)), rng.normal(size=(b, h, s, d))
    g = rng.normal(size=(b, h, t, d))
    want = reference(q, k, v, g, causal)
    q32, k32, v32, g32 = (heads_view(x) for x in (q, k, v, g))
    o = heads_view(np.full((b, h, t, d), np.nan))
    dq, dk, dv = (heads_view(np.full(x.shape, np.nan)) for x in (q, k, v))
    lse = np.full((b * h * t,), np.nan, np.float32)
    delta = np.full((b * h * t,), np.nan, np.float32)
    ptr = lambda x: ctypes.c_void_p(x.ctypes.data)  # noqa: E731 - views share the base's memory
    scale, tail = ctypes.c_float(1 / np.sqrt(d)), [ctypes.c_int(h), ctypes.c_int(t)]
    bm, bn, nt, *_ = config[d]["forward"]
    getattr(lib, f"run_forward_{d}")(
        (t + bm - 1) // bm, b * h, nt, shared["forward"],
        ptr(q32), ptr(k32), ptr(v32), ptr(o), ptr(lse), *strides(q32), *strides(k32),
        *strides(v32), *strides(o), *tail, ctypes.c_int(s), scale, ctypes.c_int(causal))
    rows = b * h * t
    getattr(lib, f"run_delta_{d}")((rows * d // 4 + 255) // 256, 1, 256, 0, ptr(o), ptr(g32),
                                   ptr(delta), ptr(dq), *strides(o), *strides(g32), *strides(dq),
                                   *tail, ctypes.c_int(rows))
    bm, bn, nt, *_ = config[d]["backward"]
    getattr(lib, f"run_backward_{d}")(
        (s + bn - 1) // bn, b * h, nt, shared["backward"],
        ptr(q32), ptr(k32), ptr(v32), ptr(g32), ptr(lse), ptr(delta), ptr(dq), ptr(dk), ptr(dv),
        *(n for x in (q32, k32, v32, g32, dq, dk, dv) for n in strides(x)), *tail,
        ctypes.c_int(s), scale, ctypes.c_int(causal))
    got = (o, lse.reshape(b, h, t), dq, dk, dv)
    # ‖error‖ / ‖float64‖, absolute below 1: at T = 1, dQ = dK = 0 is a cancellation (float64
    # leaves 1e-16, float32 1e-7), no scale to divide by
    return [float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1.0)) for x, y in zip(got, want)]


SHAPES = [(1, 2, 100, 100, True), (1, 1, 37, 37, True), (1, 2, 50, 70, False), (2, 1, 64, 64, True),
          (1, 1, 1, 1, True), (1, 1, 130, 130, True)]


def main(config: dict | None = None) -> int:
    config = config or attention_f32.CONFIG
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(config, Path(tmp))
        for d in config:
            for b, h, t, s, causal in SHAPES:
                errors = check(lib, config, b, h, t, s, d, causal)
                ok = all(np.isfinite(errors)) and max(errors) < 1e-5
                bad += not ok
                print(f"D {d} B {b} H {h} T {t} S {s} causal {causal}: O, lse, dQ, dK, dV "
                      + " ".join(f"{e:.1e}" for e in errors) + ("" if ok else "  FAILED"), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

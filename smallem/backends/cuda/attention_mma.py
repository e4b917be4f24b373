"""The fused attention on the tensor cores (issue 37): FlashAttention-2's layout on mma.sync
m16n8k16 for bf16 and fp16 runs, picked by attention.py for those precisions; the backward
kernels are in attention_mma_grad.py, the fragments, copies and products they share in
attention_mma_tiles.py; at D 64 on sm_90a modules the forward is Hopper's wgmma
(attention_mma_forward_wg.py, round 10), and keyq may be (attention_mma_grad_wg.py, round 11).

Every fragment is read by ldmatrix (.trans where a product reads a tile transposed, so no
transposed copy is made), the walked K/V (or Q/dO) tiles are copied by cp.async into a second
buffer while the tensor cores work on the first, a block's own rows are read from the float32
inputs directly (rounded once, as they land in shared memory), only the causal diagonal and the
last tiles are masked, and a warp whose rows see none of a tile's keys skips it. The kernels
write the 16-bit copies of O, dK, dV (and dQ) that the Linears read (halves.py) when the caller
says a product reads them (`copies`), and may read the float32 tiles they walk themselves
(CONFIG["staged"]).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from . import halves
from .attention_mma_dq import KERNELS_DQ
from .attention_mma_forward import KERNELS
from .attention_mma_forward_wg import KERNELS_WG
from .attention_mma_forward_wgq import KERNELS_WGQ, wgq_entries, wgq_shared
from .attention_mma_grad import KERNELS_BACKWARD
from .attention_mma_grad2d import KERNELS_BACKWARD_2D
from .attention_mma_grad_wg import KERNELS_BACKWARD_WG
from .attention_mma_tiles import FORMATS, TILES, U16, WIDTHS, padded
from .common import HEADER, _empty, cupy, kernel, strides

__all__ = ["FORMATS", "WIDTHS", "CONFIG", "source", "forward", "backward", "shared_bytes"]

# kind -> width -> (warps, rows of the walked tile[, the forward's m-tiles of 16 rows a warp, Q
# fragments in registers (QR)] [the key kernel's K, V fragments in registers (KR), the blocks a
# multiprocessor must hold (registers capped by __launch_bounds__; 0: no cap)]): forward,
# dK, dV and dQ by atomics (key: the layout of the kernel keyq). 8 warps in the forward at D 64
# and 128: timed in round 7's first call (results/round7/attention_call1_variants.log), 10-15 %
# faster than 4 there; QR, 4 warps of 32 rows and 128-key tiles within the noise of it
# (results/round9/attention/, call 1). Key kernels: KR with 4 warps at D 64 (64 keys a block, 2
# blocks a multiprocessor) 9 % faster than 8 warps without at T 4,096, KR 4.5 % faster at D 128
# (round 9, call 1).
CONFIG = {"forward": {16: (4, 64, 1, 0), 32: (4, 64, 1, 0), 64: (8, 64, 1, 0), 128: (8, 64, 1, 0)},
          "key": {16: (4, 64, 0, 0), 32: (4, 64, 0, 0), 64: (4, 64, 1, 0), 128: (8, 32, 1, 0)},
          # (forward, key kernels): 1 where the kernel reads the float32 tiles it walks itself
          # (K, V; Q) through a float32 stage in shared memory, 0 where a convert launch first
          # rounds them into 16-bit rows (round 7's way). Staged was faster only in the key kernel
          # at D 32 (8-9 %), 3-32 % slower elsewhere (results/round8/attention/, variants).
          "staged": {16: (0, 0), 32: (0, 1), 64: (0, 0), 128: (0, 0)},
          # 1: keyq by FlashAttention-2's 2-D warp tiling (attention_mma_grad2d.py; where key has 4
          # or 8 warps, 64-query tiles, not staged, else mma_key; its KR kept). Round 9b at D 64 (4
          # warps, KR): fwd + bwd captured 1.6-2.9 % faster at T 1,024-4,096, correct without copies;
          # (results/round9/attention_bf16b.md); round 10: 1.3-3.4 % faster at every T in two more
          # calls, the copies path correct on the device, the bf16 step level (11.966 against 11.958
          # ms at 8 x 512; results/round10/attention_bwd.md): on at D 64
          "tiled": {16: 0, 32: 0, 64: 1, 128: 0},
          # the forward's (LF, LZ, WG), round 10 (attention_mma_forward.py): LF 1 launches the grid as
          # (B·H, query blocks), the longest causal blocks of every head first; LZ 1 rescales O only
          # where a row's running max moved; WG 1: the products by wgmma (sm_90a, the softmax of a
          # tile overlapping the last tile's P V; attention_mma_forward_wg.py) where the forward's
          # layout is one it was written for (D 64, 4 or 8 warps, 64-key tiles, converted K, V).
          # D 64 (results/round10/attention_fwd.md, captured, bf16, causal, T 1,024 / 2,048 /
          # 4,096): forward 0.242 / 0.391 / 0.677 ms -> LF, LZ 0.231 / 0.355 / 0.607 (mma.sync,
          # NVRTC's modules) -> with WG 0.199 / 0.296 / 0.491, forward + backward 0.868 / 1.430 /
          # 2.563 -> 0.823 / 1.345 / 2.369; each correct against float64 (bf16, fp16)
          "forward_opts": {16: (0, 0, 0), 32: (0, 0, 0), 64: (1, 1, 1), 128: (0, 0, 0)},
          # where WG is on: (warps, keys, stages, blocks a multiprocessor) of the forward with Q
          # from shared memory and the K/V ring filled by bulk copies on mbarriers
          # (attention_mma_forward_wgq.py, round 13; warps / 4 warpgroups of 64 query rows), run
          # from T = forward_wg_from on (round 10's below). Round 13's second call (results/round13/
          # fwd/, captured, bf16, causal, T 1,024 / 2,048 / 4,096): forward 0.198 / 0.296 / 0.491 ms
          # round 10's -> 0.199 / 0.288 / 0.472 (8, 64, 3, 2); fwd + bwd 0.711 / 1.153 / 2.032 ->
          # 0.710 / 1.144 / 1.994. Slower (removed): 12 warps x 128 keys (round 12's tile) 0.229 /
          # 0.311 / 0.484, 4 x 128 (3 blocks) 0.229 / 0.319 / 0.492, 4 x 64 (4 blocks) 0.219 / 0.314
          # / 0.511, a persistent grid (0.220 / 0.313 / 0.500 at 4 x 128; 12 x 128 0.507 at 4,096).
          # Round 15 (results/round15/bf16/call2/, one process, fwd + bwd at T 1,024 / 2,048 / 4,096):
          # the ring refilled with warpgroup 0 waiting (no C7520) 0.690 / 1.065 / 1.790 ms against
          # round 14's 0.688 / 1.101 / 1.868; run from T 1,024 on, 0.680 at 1,024 (round 10's
          # forward there 0.688-0.690 in the same process), so forward_wg_from 1,024 (was 2,048).
          # Slower: 4 stages (the refill 2 tiles behind) 1.069 / 1.798; a producer warp (call 1,
          # 9-warp blocks) 1.174 / 1.930 against round 14's 1.105 / 1.878
          "forward_wg": {64: (8, 64, 3, 2)},
          "forward_wg_from": {64: 1024},
          # 1: keyq by wgmma (sm_90a; attention_mma_grad_wg.py) where key's layout is the one it was
          # written for (D 64, 4 warps = one warpgroup of 64 keys, 64-query tiles, converted rows),
          # every operand from shared memory (round 11's way 3: 3 blocks a multiprocessor); it takes
          # the place of the tiled keyq there. Round 11 (results/round11/attention_bwd.md; bf16,
          # causal, B·T 32,768, 8 heads, T 1,024 / 2,048 / 4,096): backward 0.632 / 1.030 / 1.833 ms
          # tiled -> 0.535 / 0.876 / 1.564; round 13 (results/round13/bwd/): with two overlaps inside
          # the warpgroup 0.525 / 0.852 / 1.459, captured fwd + bwd 0.697 / 1.118 / 1.893 ms (1.49 /
          # 1.53 / 1.51x cuDNN). Round 11's ways with A operands in registers (4-11 % slower) and
          # round 13's 2, 3 warpgroups a block (5-19 % slower) are gone.
          "key_wg": {16: 0, 32: 0, 64: 1, 128: 0},
          # T (queries) from which the wgmma keyq's grid is (B·H, key blocks), the longest causal
          # blocks of every head first (a twin kernel, flash_mma_keyq_lf_*, in the same module); 0:
          # never. Round 11 (w 1, 3 blocks): backward 0.594 / 0.879 / 1.495 ms against 0.533 / 0.874
          # / 1.559 (better only at T 4,096; every head's blocks at once may share less of L2)
          "key_lf": {16: 0, 32: 0, 64: 4096, 128: 0}}
# Whether the modules are compiled for sm_90a: the forward and keyq take wgmma only then (CONFIG
# ["forward_opts"]'s WG, CONFIG["key_wg"]). "auto" (the default): "nvrtc" on a
# compute-capability-9.0 device (H100, H200), else False. True: benchmarks/cubins.py's nvcc build
# (cubins.install sets it). "nvrtc": CuPy's NVRTC compiles them with -arch=sm_90a (round 10's probe
# found the option taken, results/round10/attention_fwd.md). False: NVRTC's plain sm_90 (or another
# device), where the wgmma kernels would be a trap: the forward stays mma_forward, keyq the tiled one.
SM90A: bool | str = "auto"


def sm90a() -> bool | str:
    """SM90A as it applies on this machine ("auto" resolved)."""
    return SM90A if SM90A != "auto" else ("nvrtc" if _capability() == "90" else False)


@cache
def _capability() -> str:
    """The device's compute capability ("90" on an H200), "" where CuPy sees none."""
    try:
        return str(cupy.cuda.Device().compute_capability)
    except Exception:  # no CuPy, no driver, no device: no sm_90a
        return ""


def effective(config: dict | None = None) -> dict:
    """`config` (CONFIG), without the wgmma kernels (the forward's WG, key_wg) where the modules
    are not compiled for sm_90a."""
    config = config or CONFIG
    wg = any(o[2] for o in config.get("forward_opts", {}).values()) or any(config.get("key_wg", {}).values())
    if sm90a() or not wg:
        return config
    return {**config, "forward_opts": {d: (*o[:2], 0) for d, o in config["forward_opts"].items()},
            "key_wg": {d: 0 for d in config.get("key_wg", {})}}


# With copies asked for (forward's and backward's `copies`: the Transformer's Linears read O, dQ,
# dK, dV in 16 bits) the kernels write them beside the float32 arrays and register them
# (halves.py); without, they get null pointers and store nothing (a bench, a lesson's attention).
# dQ's copy written by the key kernel (the last key block to add to a query
# tile writes it, after one fence a block: right to the bit on the H200, but the longest key block
# is last on nearly every tile and copies them alone; backward 1.233 / 2.646 ms at D 64, T 1,024 /
# 4,096 against 0.961 / 2.429 with no copies, results/round8/attention/), or (False) made by the
# Linear reading dQ: one launch a block, a pass over dQ at memory speed.
DQ_COPY = False


def _tiled(config: dict, d: int) -> bool:
    """keyq by the 2-D tiling: where CONFIG["tiled"] asks and key's layout is one it was written for
    (4 or 8 warps, 64-query tiles, converted rows, D ≥ 8·warps); mma_key elsewhere, so that a
    bench's or test's other layouts (staged, 32-query tiles) keep running with the switch on."""
    w, n, *_ = config["key"][d]
    layout = w in (4, 8) and n == 64 and not config["staged"][d][1] and d >= 8 * w
    return bool(config.get("tiled", {}).get(d, 0)) and layout


def _key_wg(config: dict, d: int) -> bool:
    """keyq by wgmma: where CONFIG["key_wg"] asks and key's layout is the one it was written for (D
    64, 4 warps = one warpgroup of 64 keys, 64-query tiles, converted rows)."""
    w, n, *_ = config["key"][d]
    layout = d == 64 and w == 4 and n == 64 and not config["staged"][d][1]
    return bool(config.get("key_wg", {}).get(d, 0)) and layout


def _key_lf(config: dict, d: int, t: int | None = None) -> int:
    """1 where the wgmma keyq has its LF twin (CONFIG["key_lf"] not 0) and, given T, runs it (T at or
    past CONFIG["key_lf"]): the grid (B·H, key blocks)."""
    start = config.get("key_lf", {}).get(d, 0) if _key_wg(config, d) else 0
    return int(bool(start) and (t is None or t >= start))



def _wg(config: dict, d: int) -> bool:
    """The forward by wgmma: where CONFIG["forward_opts"] asks and the forward's layout is the one
    it was written for (D 64, 4 or 8 warps of 16 rows, 64-key tiles, K and V converted)."""
    w, n, mt, _ = config["forward"][d]
    layout = d == 64 and w in (4, 8) and n == 64 and mt == 1 and not config["staged"][d][0]
    return bool(config.get("forward_opts", {}).get(d, (0, 0, 0))[2]) and layout


def _wgq(config: dict, d: int) -> bool:
    """The forward with Q from shared memory (CONFIG["forward_wg"], D 64) compiled beside the
    other: where the forward is wgmma's (WG)."""
    return d == 64 and bool(config.get("forward_opts", {}).get(d, (0, 0, 0))[2]) and \
        bool(config.get("forward_wg", {}).get(d)) and not config["staged"][d][0]


def shared_bytes(kind: str, d: int, config: dict | None = None) -> int:
    """A block's dynamic shared memory (kind forward or keyq): its own rows (Q; K, V), two buffers
    of the walked tiles (K, V; Q, dO) in 16-bit numbers, rows padded by 8; keyq's lse, δ and dSᵀ
    tile (and Pᵀ, tiled). Staged: the float32 stage (K, V forward, in one 16-bit buffer; Q keyq)."""
    config = config or CONFIG
    if kind == "forwardwg":
        return wgq_shared(config["forward_wg"][d], d)
    w, n, *more = config["key" if kind == "keyq" else kind][d]
    own = (more[0] if kind == "forward" else 2) * 16 * w
    tiled = kind == "keyq" and _tiled(config, d)
    extra = 16 * n + (2 + 2 * tiled) * 16 * w * (n + 8) if kind == "keyq" else 0  # + dSᵀ (, Pᵀ)
    forward_staged, key_staged = config["staged"][d]
    if kind == "keyq" and _key_wg(config, d):  # 1 KiB to align; Q, dO x 2; K, V, Pᵀ, dSᵀ; lse, δ x 2
        return 1024 + 8 * n * d * 2 + 16 * n
    if kind == "forward" and _wg(config, d):  # 1 KiB to align the swizzled tiles; 3 of K, V unpadded
        return 1024 + 3 * 2 * n * d * 2 + 2 * own * (d + 8)
    if kind == "forward" and forward_staged:
        return 2 * (own + 2 * n) * (d + 8) + 2 * n * d * 4
    return 2 * (own + 4 * n) * (d + 8) + extra + (n * d * 4 if kind == "keyq" and key_staged else 0)


@cache
def _source(config_key: tuple, formats: tuple, widths: tuple, copies: bool) -> str:
    config = {kind: dict(widths) for kind, widths in config_key}
    fwd = ("q, k, v, kr, vr, o, oh, lse, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, "
           "heads, T, S, Tp, Sp, scale, causal, qk")
    grad = ("q, k, v, g, qr, kr, vr, gr, lse, delta, dx, dy, dz, hx, hy, hz, counts, sqb, sqh, sqt, "
            "skb, skh, skt, svb, svh, "
            "svt, sgb, sgh, sgt, sdxb, sdxh, sdxt, sdyb, sdyh, sdyt, sdzb, sdzh, sdzt, heads, T, S, Tp, Sp, "
            "scale, causal")
    conv = "x, sxb, sxh, sxt, out, heads, T, Tp, o, sob, soh, sot, delta, zero, szb, szh, szt"
    out = [HEADER, f"#define COPIES {int(copies)}\n", TILES, KERNELS, KERNELS_WG, KERNELS_DQ,
           KERNELS_BACKWARD, KERNELS_BACKWARD_2D, KERNELS_BACKWARD_WG, KERNELS_WGQ]
    for fmt in formats:
        for d in widths:
            f16 = int(fmt == "fp16")
            out.append(f'extern "C" __global__ void flash_mma_convert_{fmt}_{d}(MMA_CONVERT_ARGS) '
                       f"{{ to_rows<{f16}, {d}>({conv}); }}\n")
            w, n, mt, qr = config["forward"][d]
            lf, lz, _ = config.get("forward_opts", {}).get(d, (0, 0, 0))
            forward_staged, key_staged = config["staged"][d]
            # two blocks a multiprocessor at D 64 (at most 128 registers): the stage and O's copy
            # took round 8's forward (8 warps, 64 keys a tile) to 134, one block (nvcc -Xptxas -v)
            bounds = f"__launch_bounds__({32 * w}, 2) " if d == 64 and w * mt == 8 and n == 64 else ""
            body = (f"mma_forward_wg<{f16}, {w}, {lf}, {lz}>" if _wg(config, d)
                    else f"mma_forward<{f16}, {d}, {n}, {w}, {mt}, {forward_staged}, {qr}, {lf}, {lz}>")
            out.append(f'extern "C" __global__ {bounds}void flash_mma_forward_{fmt}_{d}(MMA_FORWARD_ARGS) '
                       f"{{ {body}({fwd}); }}\n")
            if _wgq(config, d):  # its convert (rows swizzled) and the long sequences' forward
                out.append(wgq_entries(fmt, d, config["forward_wg"][d], conv, fwd))
            w, n, kr, held = config["key"][d]
            # the wgmma keyq: 3 blocks a multiprocessor at least (nvcc: 166 registers, the cap not
            # reached; NVRTC compiled round 13's overlaps to 181 uncapped: 2 blocks)
            held = max(held, 3) if _key_wg(config, d) else held
            bounds = f"__launch_bounds__({32 * w}, {held}) " if held else ""
            for lf in range(1 + _key_lf(config, d)):  # the plain kernel, and its LF twin
                body = (f"mma_key_ss<{f16}, {lf}>" if _key_wg(config, d)
                        else f"mma_key2d<{f16}, {d}, {w}, {kr}>" if _tiled(config, d)
                        else f"mma_key<{f16}, {d}, {n}, {w}, {key_staged}, {kr}>")
                out.append(f'extern "C" __global__ {bounds}void flash_mma_keyq{"_lf" * lf}_{fmt}_{d}'
                           f"(MMA_GRAD_ARGS) {{ {body}({grad}); }}\n")
    return "".join(out)


def source(config: dict | None = None, formats: tuple = FORMATS, widths: tuple = WIDTHS,
           copies: bool = True) -> str:
    """The kernels flash_mma_<kind>_<format>_<width> of `formats` and `widths`, kind convert
    (rows in the format), forward, keyq (dK, dV and dQ by atomics);
    `config` (CONFIG's shape) for a bench's variants; `copies` off: the 16-bit copies' stores
    compiled out (the kernels of the passes that write none)."""
    config = config or effective()
    return _source(tuple((kind, tuple(sorted(w.items()))) for kind, w in config.items()),
                   tuple(formats), tuple(widths), bool(copies))


_READY: set[tuple] = set()


def mma_kernel(kind: str, fmt: str, d: int, copies: bool) -> Any:
    """The kernel, allowed the dynamic shared memory it takes (past the 48 KiB default). One
    module per format, width and `copies`: a process compiles only the kernels it runs (NVRTC
    takes seconds a module)."""
    fn = kernel(source(formats=(fmt,), widths=(d,), copies=copies), f"flash_mma_{kind}_{fmt}_{d}",
                "sm_90a" if sm90a() == "nvrtc" else "")
    if not kind.startswith("convert") and (fn, kind, d) not in _READY:
        fn.max_dynamic_shared_size_bytes = shared_bytes(kind.removesuffix("_lf"), d, effective())
        _READY.add((fn, kind, d))
    return fn


def to_rows(x: Any, fmt: str, heads: tuple[int, int], o: Any = None, delta: Any = None,
            zero: Any = None, copies: bool = False, sw: bool = False) -> Any:
    """x's values in `fmt`, per head as rows (Tp, D), zeros past T: the tiles the kernels walk
    are then whole and 16-byte aligned for cp.async. With o (x = dO): δ = rowsum(dO ⊙ O) too;
    with zero (an array of x's shape): zeros into it, in the same pass. `copies`: the module of
    the pass that calls it (with or without the copies' stores), so that a pass compiles one.
    `sw`: rows swizzled as mma_forward_wgq reads them (D 64)."""
    (batch, h), t, d = heads, x.shape[-2], x.shape[-1]
    tp = padded(t)
    out = _empty((batch * h * tp * d,), U16)
    with_o = (0, 0, 0, 0, 0) if o is None else (o, *strides(o), delta)  # 0: a null pointer
    with_zero = (0, 0, 0, 0) if zero is None else (zero, *strides(zero))
    kind = "convertsw" if sw else "convert"
    mma_kernel(kind, fmt, d, copies)(((tp * d // 8 + 255) // 256, batch * h), (256,), (
        x, *strides(x), out, np.int32(h), np.int32(t), np.int32(tp), *with_o, *with_zero))
    return out


def _blocks(kind: str, d: int, n: int) -> tuple[int, int]:
    """(blocks over n own rows, threads a block)."""
    w, _, *more = CONFIG["key" if kind == "keyq" else kind][d]
    rows = 16 * w * (more[0] if kind == "forward" else 1)
    return (n + rows - 1) // rows, 32 * w


def _copy(x: Any, fmt: str, copies: bool) -> Any:
    """What a kernel gets for its output x: a 16-bit array laid out as x's memory (x a heads view
    of a (B, T, H, D) array, or plain), registered in halves as the copy of that memory, or the
    null pointer (no copies asked for, or x not at the start of its memory)."""
    base = x if x.base is None else x.base
    if not copies or base.data.ptr != x.data.ptr or base.size != x.size or not base.flags.c_contiguous:
        return halves.NO_COPY
    half = _empty(base.shape, U16)
    halves.register(base, half, fmt)
    return half


def _zeros(x: Any) -> None:
    """x's memory (x a view of a contiguous array, or one) zeroed in one memset on the stream."""
    base = x if x.base is None else x.base
    base.data.memset_async(0, base.nbytes)


def forward(q: Any, k: Any, v: Any, out: Any, lse: Any, fmt: str, heads: tuple[int, int],
            scale: float, causal: bool, copies: bool = False) -> Any:
    """O and lse into `out`, `lse` (float32) from q, k, v (float32) read in `fmt`; O's 16-bit
    copy registered when `copies` (a product reads O in 16 bits). Staged (CONFIG): K, V read by
    the kernel, no convert. Returns Q's rows in `fmt` as the backward's key kernel walks them
    (to_rows' layout), which the forward rounds anyway and stores on the way (round 14: the
    backward's Q convert gone), or None where the key kernel reads Q itself (staged)."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    staged, config = CONFIG["staged"][d][0], effective()
    kept = None if CONFIG["staged"][d][1] else _empty((batch * h * padded(t) * d,), U16)
    wgq = _wgq(config, d) and t >= config["forward_wg_from"][d]
    kr, vr = (0, 0) if staged else tuple(to_rows(x, fmt, heads, copies=copies, sw=wgq) for x in (k, v))
    blocks, threads = _blocks("forward", d, t)
    grid = (batch * h, blocks) if CONFIG["forward_opts"][d][0] else (blocks, batch * h)
    kind = "forwardwg" if wgq else "forward"
    more: tuple = ()
    if wgq:  # items (head, query tile), the longest first: a block each
        w = config["forward_wg"][d][0]
        grid, threads, more = (batch * h * -(-t // (16 * w)),), 32 * w, (np.int32(batch * h),)
    mma_kernel(kind, fmt, d, copies)(grid, (threads,), (
        q, k, v, kr, vr, out, _copy(out, fmt, copies), lse,
        *strides(q), *strides(k), *strides(v), *strides(out),
        np.int32(h), np.int32(t), np.int32(s), np.int32(padded(t)), np.int32(padded(s)),
        np.float32(scale), np.int32(causal), halves.NO_COPY if kept is None else kept, *more),
        shared_mem=shared_bytes(kind, d, config))
    return kept


def backward(q: Any, k: Any, v: Any, grad: Any, lse: Any, delta: Any, grads: tuple, fmt: str,
             heads: tuple[int, int], scale: float, causal: bool, out: Any = None,
             copies: bool = False, q_rows: Any = None) -> None:
    """dK, dV and dQ into `grads` (dq, dk, dv; float32), their 16-bit copies registered when
    `copies` (the Linears' backward reads them). δ into `delta`, by dO's convert, when `out` (O)
    is given; else computed before (attention.py). Q's rows: `q_rows` (the forward's), else its
    convert; staged (CONFIG): Q read by the key kernel, neither."""
    (batch, h), t, s, d = heads, q.shape[-2], k.shape[-2], q.shape[-1]
    dq, dk, dv = grads
    staged = CONFIG["staged"][d][1]
    convert_q = not staged and q_rows is None
    # dQ (added to by atomics) zeroed by Q's convert, else by dO's (the same pass over the rows),
    # or (staged: dO's convert computes δ only where `out` is given) by a memset
    zero_dq = not convert_q and not staged
    g_rows = to_rows(grad, fmt, heads, o=out, delta=delta, zero=dq if zero_dq else None, copies=copies)
    q_rows = to_rows(q, fmt, heads, zero=dq, copies=copies) if convert_q else q_rows
    rows = [g_rows if q_rows is None else q_rows, g_rows, g_rows, g_rows]  # an unread slot: any buffer
    if staged:
        _zeros(dq)
    hq = _copy(dq, fmt, copies) if DQ_COPY else halves.NO_COPY  # none nobody writes
    hk, hv = _copy(dk, fmt, copies), _copy(dv, fmt, copies)
    counts = halves.NO_COPY
    if hq is not halves.NO_COPY:  # per (B·H, query tile): the key blocks that added
        counts = _empty((batch * h * -(-t // CONFIG["key"][d][1]),), np.uint32)
        counts.data.memset_async(0, counts.nbytes)
    tail = (np.int32(h), np.int32(t), np.int32(s), np.int32(padded(t)), np.int32(padded(s)),
            np.float32(scale), np.int32(causal))
    common = (q, k, v, grad, *rows, lse, delta)
    ins = tuple(n for x in (q, k, v, grad) for n in strides(x))
    outs = (dk, dv, dq, hk, hv, hq, counts, *strides(dk), *strides(dv), *strides(dq))
    blocks, threads = _blocks("keyq", d, s)
    lf = _key_lf(effective(), d, t)
    grid = (batch * h, blocks) if lf else (blocks, batch * h)
    mma_kernel("keyq_lf" if lf else "keyq", fmt, d, copies)(grid, (threads,), (
        *common, *_grad_args(outs, ins, tail)), shared_mem=shared_bytes("keyq", d, effective()))


def _grad_args(outs: tuple, ins: tuple, tail: tuple) -> tuple:
    """MMA_GRAD_ARGS after lse, δ: dx, dy, dz, their copies, counts, the inputs' strides, the
    outputs' strides, tail."""
    return (*outs[:7], *ins, *outs[7:], *tail)

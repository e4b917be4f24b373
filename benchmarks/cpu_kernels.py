"""The float32 CPU's compiled kernels against their NumPy routes on one thread, at the shapes of
bench's CPU Transformer step (batch 64, context 64, width 64, 4 heads): the fused attention (its
products in BLAS, compiled_attention.py; compiled_kernels' own loops; NumPy's calls), GELU,
LayerNorm and cross-entropy, forward and rule, in interleaved rounds (issue 38, round 10).

    python benchmarks/cpu_kernels.py [ROUNDS]   one JSON line: ms per call (median), per route

Each entry is one layer's call as the step makes it (the backend's functions, blocks and all),
timed by the wall clock and by this process's CPU time, with the minor page faults it took, each
round in another order; the machine's CPU as LLVM names it, and whether LLVM vectorized GELU's
loop (packed against scalar float instructions in its code).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
from threadpoolctl import threadpool_limits

from smallem.autodiff.operations import CrossEntropy, LayerNorm
from smallem.backends import get_backend
from smallem.backends import numpy_fused as fused
from smallem.backends.cpu import attention, compiled, minor_faults, team

B, H, T, D, C, V = 64, 4, 64, 16, 64, 257
F32 = np.float32


def _on(route: str, blas: bool = True, rows: int | None = None) -> None:
    """SMALLEM_KERNELS=route, the attention's products in BLAS (`rows` queries a product, None:
    compiled_attention.ROWS) or in compiled_kernels' loops."""
    from smallem.backends.cpu import compiled_attention

    os.environ[compiled.ENV] = route
    compiled._blas[:] = [] if blas else [False]
    if blas and compiled.attention_blas():
        compiled.attention_blas().ROWS = rows or compiled_attention.ROWS


def cases() -> dict[str, Callable[[], object]]:
    rng = np.random.default_rng(0)
    be = get_backend("cpu")
    q, k, v, g = (rng.normal(size=(B, T, H, D)).astype(F32).transpose(0, 2, 1, 3) for _ in range(4))
    op = SimpleNamespace(causal=True, factor=lambda d: d ** -0.5, saved=())
    _on("numba")
    out = attention.attention_forward(be, q, k, v, op)
    saved = op.saved
    hidden = (2 * rng.normal(size=(B, T, 4 * C))).astype(F32)
    x = rng.normal(size=(B, T, C)).astype(F32)
    w, b = np.ones(C, F32), np.zeros(C, F32)
    logits = (3 * rng.normal(size=(B * T, V))).astype(F32)
    entropy = CrossEntropy(rng.integers(0, V, B * T))
    norm = LayerNorm()

    def routes(name: str, fn: Callable[[], object], which: tuple = ("numba", "numpy")) -> dict:
        def on(route: str) -> Callable[[], object]:
            def call() -> object:
                rows = int(route.split("rows")[1]) if "rows" in route else None
                _on(route.split("/")[0], route != "numba/loops", rows)
                return fn()
            return call
        return {f"{name} [{r}]": on(r) for r in which}

    old, flat = round9_gelu(), hidden.reshape(-1)

    def gelu_round9() -> np.ndarray:  # numpy_fused.gelu's blocks and output, round 9's kernel
        into = np.empty_like(flat)
        fused.each(lambda s: old(flat[s], into[s]), flat.size, 1, passes=2)
        return into

    from smallem.backends.cpu import compiled_kernels as kernels

    def placed(delta: int, back: bool) -> Callable[[], None]:
        """Today's kernel into a buffer `delta` bytes ahead of its input modulo 4 KiB, run
        forward or backward (4K aliasing: numpy_fused.backward)."""
        raw = np.empty(flat.nbytes + 2 * fused.PAGE, np.uint8)
        skip = (flat.ctypes.data + delta - raw.ctypes.data) % fused.PAGE
        into = raw[skip:skip + flat.nbytes].view(F32)
        return lambda: fused.each(lambda s: kernels.gelu(flat[s], into[s], back), flat.size, 1,
                                  passes=2)

    three = ("numba", "numba/rows64", "numba/rows16", "numba/loops", "numpy")
    return {
        **routes("attention forward", lambda: attention.attention_forward(be, q, k, v, op), three),
        **routes("attention rule", lambda: attention.attention_rule(
            be, g, out, q, k, v, SimpleNamespace(causal=True, factor=op.factor, saved=saved)), three),
        **routes("gelu forward", lambda: fused.gelu(hidden)),
        "gelu forward [numba, round 9's tanh form]": gelu_round9,
        **{f"gelu forward [numba, out {d} B ahead, {'backward' if b else 'forward'}]": placed(d, b)
           for d in (0, 16, 256, 2048, 4080) for b in (False, True)},
        **routes("gelu rule", lambda: fused.gelu_rule(be, hidden, None, hidden)),
        **routes("layer_norm forward", lambda: fused.layer_norm_forward(be, x, w, b, norm)),
        **routes("layer_norm rule", lambda: fused.layer_norm_rule(be, x, None, x, w, b, norm)),
        **routes("cross_entropy forward", lambda: fused.cross_entropy_forward(be, logits, entropy)),
        **routes("cross_entropy rule", lambda: fused.cross_entropy_rule(be, F32(1), None, logits,
                                                                         entropy)),
    }


def round9_gelu() -> Callable:
    """Round 9's compiled GELU forward (the tanh form, tanh as 1 − 2/(e^2u + 1)), timed beside the
    package's in the same process (round 10's host call timed a·σ(2u) there, reverted since)."""
    import numba

    from smallem.backends.cpu import compiled_kernels as kernels

    exp, one, two, half = kernels._exp, F32(1), F32(2), F32(0.5)
    scale, cubic, clip = F32(kernels.GELU_SCALE), F32(kernels.GELU_CUBIC), F32(9)

    @numba.njit(**{**kernels.JIT, "cache": False})
    def gelu(a, out):
        for i in range(a.size):
            x = a[i]
            u = min(max(scale * x * (one + cubic * x * x), -clip), clip)
            out[i] = half * x * (one + (one - two / (exp(two * u) + one)))

    return gelu


def vectorized() -> dict:
    """GELU's compiled loop as LLVM left it: packed and scalar float instructions in its code."""
    import llvmlite.binding as llvm
    import numba

    from smallem.backends.cpu import compiled_kernels as kernels

    fresh = numba.njit(**{**kernels.JIT, "cache": False})(kernels.gelu.py_func)  # cached: no code
    fresh(np.ones(64, F32), np.empty(64, F32), False)
    asm = "".join(fresh.inspect_asm().values())
    return {"llvm cpu": llvm.get_host_cpu_name(),
            "gelu packed": len(re.findall(r"\bv\w+ps\s[^\n]*%[yz]mm", asm)),
            "gelu scalar": len(re.findall(r"\bv\w+ss\s", asm))}


def main(rounds: int) -> dict:
    team.resize(1)
    with threadpool_limits(1):
        calls = cases()
        for fn in calls.values():  # compiles, caches, first allocations
            fn()
        wall: dict[str, list[float]] = {name: [] for name in calls}
        cpu: dict[str, list[float]] = {name: [] for name in calls}
        faults = dict.fromkeys(calls, 0)
        names = list(calls)
        for r in range(rounds):  # each round in another order: what ran before a call moves
            for name in names[r % len(names):] + names[:r % len(names)]:
                fn = calls[name]
                f, w, c = minor_faults() or 0, time.perf_counter(), time.process_time()
                fn()
                cpu[name].append(time.process_time() - c)
                wall[name].append(time.perf_counter() - w)
                faults[name] += (minor_faults() or 0) - f
    _on("numba")
    ms = lambda xs: round(1e3 * float(np.median(xs)), 3)  # noqa: E731
    return {"rounds": rounds, "blas attention": bool(compiled.attention_blas()), **vectorized(),
            "wall ms": {n: ms(t) for n, t in wall.items()}, "cpu ms": {n: ms(t) for n, t in cpu.items()},
            "faults a call": {n: round(f / rounds, 1) for n, f in faults.items()}}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)), flush=True)

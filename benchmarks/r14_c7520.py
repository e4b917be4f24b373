"""Why ptxas serializes the long-sequence forward's products (C7520, "wgmma.mma_async instructions
are serialized due to program dependence on compiler-inserted WG.AR in divergent path", round 14):
flash_mma_forwardwg_bf16_64 compiled by nvcc for sm_90a with one piece of mma_forward_wgq changed
at a time, and whether ptxas still says it. No GPU (results/round14/bf16/README.md, "Noticed").

    python benchmarks/r14_c7520.py
"""

import subprocess
import sys
import tempfile
from pathlib import Path

from smallem.backends.cuda import attention_mma as am

REFILL = ("            if (threadIdx.x == 0 && j > 0 && j - 1 + NB < tiles)\n"
          "                wgq_fill<N, NB>(kv, kb, vb, j - 1 + NB, base + j - 1 + NB, full, empty);\n")
# wgq_fill with the issuing thread a parameter (lane == 0 issues); WAIT: the wait on `empty` first
FILL = """template <int N, int NB> __device__ __forceinline__ void wgq_fill_by(
        half_t* kv, const half_t* kb, const half_t* vb, int j, int g, unsigned long long* full,
        unsigned long long* empty, int lane) {
    enum { TILE = N * 64, BYTES = TILE * 2 };
    int k = g % NB;
    WAIT
    if (lane == 0) {
        mbar_expect(full + k, 2 * BYTES);
        bulk_copy(kv + k * 2 * TILE, kb + (long long)j * TILE, BYTES, full + k);
        bulk_copy(kv + k * 2 * TILE + TILE, vb + (long long)j * TILE, BYTES, full + k);
    }
}
// O by the online softmax (D 64 only)"""
WAIT = "if (g >= NB) mbar_wait(empty + k, (g / NB + 1) & 1);"
ANCHOR = "// O by the online softmax (D 64 only)"


def by(who: str, wait: bool) -> list:
    """The refill by `who` (a condition), lane = its argument to wgq_fill_by."""
    cond, lane = who.split(";")
    call = (f"            if ({cond}j > 0 && j - 1 + NB < tiles)\n"
            "                wgq_fill_by<N, NB>(kv, kb, vb, j - 1 + NB, base + j - 1 + NB, full, empty, "
            f"{lane});\n")
    return [(ANCHOR, FILL.replace("WAIT", WAIT if wait else "")), (REFILL, call)]


VARIANTS = {
    "as shipped": [],
    "no refill in the loop": [(REFILL, "")],
    "no arrive on empty": [("            if (j > 0 && lane == 0) mbar_arrive(empty + (base + j - 1) % NB);"
                            "  // done with tile j - 1\n", "")],
    "warp 0 waits, lane 0 issues": by("warp == 0 && ;lane", True),
    "thread 0 issues, no wait (wrong)": by("threadIdx.x == 0 && ;0", False),
    "every thread waits, thread 0 issues": by(";threadIdx.x", True),
}


def main() -> None:
    am.SM90A = True
    base = am.source(am.effective(), ("bf16",), (64,), False)
    for name, changes in VARIANTS.items():
        src = base
        for old, new in changes:
            assert old in src, (name, old[:60])
            src = src.replace(old, new, 1)
        with tempfile.TemporaryDirectory() as tmp:
            cu = Path(tmp) / "k.cu"
            cu.write_text(src)
            run = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-Xptxas", "-v", str(cu), "-o",
                                  str(cu) + ".cubin"], capture_output=True, text=True)
        said = any("C7520" in line and "forwardwg" in line for line in run.stderr.splitlines())
        print(f"{name:38s} rc {run.returncode}  C7520 {'yes' if said else 'no'}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()

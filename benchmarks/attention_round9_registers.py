"""Registers and spills of the tensor-core attention's kernels under each of
attention_round9_variants.py's variants (bf16), by nvcc -Xptxas -v here, without a GPU:
`python benchmarks/attention_round9_registers.py [variant ...]` (round 9, issue 37)."""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import attention_round9_variants as v  # benchmarks/

from smallem.backends.cuda import attention_mma


def registers(source: str) -> list[tuple[str, int, int]]:
    """(kernel, registers, spill-store bytes) of each non-convert kernel of `source`."""
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / "k.cu"
        cu.write_text(source)
        run = subprocess.run(["nvcc", "-arch=sm_90a", "-c", str(cu), "-o", str(cu) + ".o", "-Xptxas", "-v"],
                             capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(run.stderr[:3000])
    out, fn, spill = [], "", 0
    for line in run.stderr.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            fn = m.group(1)
        if m := re.search(r"(\d+) bytes spill stores", line):
            spill = int(m.group(1))
        if (m := re.search(r"Used (\d+) registers", line)) and "convert" not in fn and "query" not in fn:
            out.append((fn, int(m.group(1)), spill))
    return out


def main() -> None:
    names = sys.argv[1:] or ["defaults", *v.VARIANTS]
    for name in names:
        change = v.VARIANTS.get(name, {})
        for d in v.widths(change) or (64, 128):
            for fn, regs, spill in registers(attention_mma.source(v.configured(change), ("bf16",), (d,))):
                print(f"{name:30s} {fn:28s} {regs:4d} registers, {spill:3d} bytes spilled", flush=True)


if __name__ == "__main__":
    main()

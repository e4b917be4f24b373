"""Compile every CUDA source of the GPU backend with nvcc, without a GPU or CuPy (a syntax and
type check before a device call): `python benchmarks/compile_kernels.py [arch]`."""

import subprocess
import sys
import tempfile
from pathlib import Path

from smallem.backends.cuda import all_sources  # importable without CuPy

arch = sys.argv[1] if len(sys.argv) > 1 else "sm_90"
sources = all_sources()
failed = 0
with tempfile.TemporaryDirectory() as tmp:
    for name, source in sources.items():
        path = Path(tmp) / f"{name}.cu"
        path.write_text(source)
        run = subprocess.run(["nvcc", f"-arch={arch}", "-c", str(path), "-o", str(path) + ".o"],
                             capture_output=True, text=True)
        if run.returncode:
            failed += 1
            print(f"{name}: FAILED\n{run.stderr}")
print(f"{len(sources) - failed}/{len(sources)} sources compile for {arch}")
sys.exit(1 if failed else 0)

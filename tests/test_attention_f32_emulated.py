"""The float32 flash attention's CUDA source (backends/cuda/attention_f32.py) run on the CPU by
benchmarks/emulate_f32_attention.py (each block's threads as std::threads, g++ -std=c++20) against
float64: the kernels' indexing, masks and tile walks checked without a GPU. Skipped where no g++
with C++20's <barrier> is installed; the GPU tests run the same kernels on the device."""

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from smallem.backends.cuda import attention_f32

ROOT = Path(__file__).resolve().parent.parent


def _emulator():
    spec = importlib.util.spec_from_file_location(
        "emulate_f32_attention", ROOT / "benchmarks" / "emulate_f32_attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cxx20() -> bool:
    if not shutil.which("g++"):
        return False
    run = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-x", "c++", "-"],
                         input="#include <barrier>\nstd::barrier<> b(1);\n", capture_output=True,
                         text=True)
    return run.returncode == 0


pytestmark = pytest.mark.skipif(not _cxx20(), reason="no g++ with C++20's <barrier>")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    emulator = _emulator()
    return emulator, emulator.build(attention_f32.CONFIG, tmp_path_factory.mktemp("emulated"))


@pytest.mark.parametrize("d", attention_f32.WIDTHS)
@pytest.mark.parametrize("b, h, t, s, causal", [(1, 2, 70, 70, True), (1, 1, 40, 90, False)])
def test_the_kernels_run_on_the_cpu_match_float64(built, d, b, h, t, s, causal):
    """O, lse, dQ, dK, dV within 1e-5 of float64 (float32's sums over at most D and S terms)."""
    emulator, lib = built
    errors = emulator.check(lib, attention_f32.CONFIG, b, h, t, s, d, causal)
    assert max(errors) < 1e-5, errors


@pytest.mark.parametrize("d, config", [
    (128, {"forward": (64, 32, 128, 2, 8), "backward": (32, 32, 128, 2, 8)}),  # KX = 8
    (128, {"forward": (64, 32, 256), "backward": (32, 64, 256, 0, 16, 2)}),  # QB = 2
    (64, {"forward": (64, 64, 128, 2, 8), "backward": (64, 64, 256, 0, 8, 2)}),
    (128, {"forward": (64, 32, 128, 2, 8), "backward": (64, 64, 256, 0, 16, 1, 2)}),  # DL = 2
    (128, {"forward": (64, 32, 128, 2, 8), "backward": (64, 64, 256, 0, 16, 1, 3)}),  # DL = 3
    (128, {"forward": (64, 32, 128, 2, 8), "backward": (64, 64, 256, 0, 16, 3)}),  # QB = 3
    (128, {"forward": (64, 16, 128, 3, 8), "backward": (64, 64, 256, 0, 16, 3)}),
    (32, {"forward": (64, 64, 128, 2), "backward": (64, 64, 256, 2, 16, 3)})])
def test_a_bench_s_other_tiles_match_float64_too(tmp_path, d, config):
    """A bench's candidates (not CONFIG's today): eight threads across the keys (KX), the next
    query tile loaded into a second buffer (QB 2; T = 70 leaves a tile's last rows past T) or
    into the one during dQ's product (QB 3), dK and dV (DL 2) and dQ too (DL 3) by warps of 16
    keys or rows × 64 columns, a forward of 16 keys a tile."""
    emulator = _emulator()
    lib = emulator.build({d: config}, tmp_path)
    for b, h, t, s, causal in [(1, 2, 70, 70, True), (1, 1, 40, 90, False)]:
        errors = emulator.check(lib, {d: config}, b, h, t, s, d, causal)
        assert max(errors) < 1e-5, errors

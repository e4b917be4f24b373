"""The float32 attention's 3xTF32 kernels (backends/cuda/attention_f32_tc.py, _tc_grad.py) run on
the CPU by benchmarks/emulate_f32_tc.py (the warp's mma.sync as an exchange of its fragments)
against float64: the fragments' indexing, masks and tile walks checked without a GPU. Skipped
where no g++ with C++20's <barrier> is installed; the GPU tests run the same kernels."""

import importlib.util
import sys
from pathlib import Path

import pytest
from test_attention_f32_emulated import _cxx20

from smallem.backends.cuda import attention_f32_tc, attention_f32_tc_grad

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not _cxx20(), reason="no g++ with C++20's <barrier>")


@pytest.fixture(scope="module")
def emulator():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("emulate_f32_tc", ROOT / "benchmarks" / "emulate_f32_tc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(emulator, tmp_path_factory):
    """Both widths' kernels in one library: the forward's tiles (emulator.FORWARD where TC has none),
    TCB's backward."""
    tiles = {d: (attention_f32_tc.TC.get(d, emulator.FORWARD[d]), attention_f32_tc_grad.TCB[d])
             for d in attention_f32_tc_grad.TCB}
    return tiles, emulator.build(tiles, tmp_path_factory.mktemp("emulated_tc"))


@pytest.mark.parametrize("d", sorted(attention_f32_tc_grad.TCB))
@pytest.mark.parametrize("b, h, t, s, causal", [(1, 2, 70, 70, True), (1, 1, 40, 90, False)])
def test_the_3xtf32_kernels_run_on_the_cpu_match_float64(emulator, built, monkeypatch, d, b, h, t, s,
                                                         causal):
    """O, lse, dQ, dK, dV within 1e-5 of float64 (the emulation sums the TF32 products exactly:
    what it checks is where each fragment's numbers come from and go)."""
    tiles, lib = built
    monkeypatch.setitem(attention_f32_tc.TC, d, tiles[d][0])  # check() sets them
    monkeypatch.setitem(attention_f32_tc_grad.TCB, d, tiles[d][1])
    errors = emulator.check(lib, tiles, b, h, t, s, d, causal)
    assert max(errors) < 1e-5, errors

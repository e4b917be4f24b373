"""`smallem bench --attention` on the CPU at small sizes: rows for fused and unfused, their saved
bytes those the tape counts (O and lse against the three (T, T) matrices)."""

import pytest

from smallem.tools import bench_attention as bench
from smallem.tools.cli import main


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(bench.TOKENS, "cpu", 64)
    monkeypatch.setitem(bench.LENGTHS, "cpu", (16, 32))
    monkeypatch.setitem(bench.WIDTHS, "cpu", (8,))
    monkeypatch.setattr(bench, "REPS", 4)


def test_attention_rows_count_what_each_keeps(tiny):
    rows = bench.attention_rows("cpu", torch=False)
    assert [(r["impl"], r["T"]) for r in rows] == [("smallem fused", 16), ("smallem unfused", 16),
                                                    ("smallem fused", 32), ("smallem unfused", 32)]
    for r in rows:
        b, h, t, d = r["B"], r["H"], r["T"], r["D"]
        scores = 3 * b * h * t * t if r["impl"] == "smallem unfused" else b * h * t  # or the lse
        assert r["saved_bytes"] == 4 * (b * h * t * d + scores)
        assert r["ms"] > 0 and r["device_bytes"] >= r["saved_bytes"]


def test_the_cli_runs_it_and_writes_json(tiny, tmp_path, capsys):
    out = tmp_path / "attention.json"
    assert main(["bench", "--attention", "--no-torch", "--json", str(out)]) == 0
    assert "smallem fused" in capsys.readouterr().out
    import json

    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and len(data["attention"]) == 4


def test_the_flop_count_is_flashattention_s():
    """Forward 4·B·H·T²·D (two products), halved when causal; backward 2.5 times the forward."""
    h = bench.HEADS
    assert bench.flops(2, 64, 32, causal=False) == 3.5 * 4 * 2 * h * 64 * 64 * 32
    assert bench.flops(2, 64, 32) == bench.flops(2, 64, 32, causal=False) / 2


def test_each_row_names_its_precision_and_rate(tiny):
    rows = bench.attention_rows("cpu", torch=False)
    for r in rows:
        assert r["dtype"] == "fp32"
        assert r["tflops"] == bench.flops(r["B"], r["T"], r["D"]) / (r["ms"] * 1e-3) / 1e12


def test_the_unfused_chain_s_memory_is_given_back_before_pytorch_s_rows(tiny, monkeypatch):
    """Round 11: at D 128, T 4,096 the unfused chain's (T, T) blocks stayed in CuPy's pool and
    PyTorch's row then found no memory (no row). Its memory goes back before PyTorch runs."""
    calls = []
    monkeypatch.setattr(bench, "_release", lambda device: calls.append("release"))
    monkeypatch.setattr(bench, "_unfused_row", lambda *a: calls.append("unfused"))
    monkeypatch.setattr(bench, "_torch_row", lambda *a: calls.append("torch"))
    bench.attention_rows("cpu", torch=True, widths=(8,), lengths=(16,), precisions=("fp32",))
    assert calls.index("release") < calls.index("torch"), calls
    assert calls.index("unfused") < calls.index("release"), calls


def test_pytorch_s_float32_units_come_from_the_kernels_it_launched():
    """The float32 rows' units for PyTorch are read from the kernel names the profiler saw
    (CUTLASS's float32 fmha: 3xTF32), others given as seen, and an unprofiled row says it assumes."""
    seen = ["fmha_cutlassB_f32_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel)",
            "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)"]
    assert bench.units("gpu", "fp32", 64, 512, "PyTorch SDPA default", seen) == "3xTF32"
    assert bench.units("gpu", "fp32", 64, 512, "PyTorch SDPA default", ["flash_fwd_kernel"]) == \
        "seen: flash_fwd_kernel"
    assert bench.units("gpu", "fp32", 64, 512, "PyTorch SDPA default").endswith(
        "(assumed: no kernels profiled)")
    assert bench.units("gpu", "fp32", 64, 512, "smallem unfused") == "FFMA"

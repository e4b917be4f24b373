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

"""`smallem bench` on the CPU with a handful of steps: the code paths, the table, the ratios and
the JSON. Never a timing pass/fail: timings belong to the benchmark, not to the tests."""

import json

from smallem.tools.bench import format_table, run_bench
from smallem.tools.cli import main


def test_bench_rows_ratios_and_table():
    result = run_bench(steps=4, warmup=1, block=2, torch=False)
    names = [(r.name, r.dtype) for r in result.rows]
    assert ("smallem cpu", "float32") in names and ("hand-written NumPy", "float32") in names
    assert ("smallem cpu64", "float64") in names
    cpu, hand = result.row("smallem cpu"), result.row("hand-written NumPy")
    assert cpu.p10 <= cpu.p90 and hand.vs_hand == 1.0
    # same weights, same batches, same formulas: the same loss to float32 rounding
    assert abs(cpu.loss - hand.loss) < 1e-4
    table = format_table(result)
    assert "smallem cpu" in table and "vs hand" in table and "machine:" in table


def test_bench_command_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", "--steps", "2", "--warmup", "1", "--block", "1", "--no-torch",
                 "--no-cpu64", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert {r["name"] for r in data["rows"]} >= {"smallem cpu", "hand-written NumPy"}
    assert "ms/step" in capsys.readouterr().out


def test_bench_times_the_transformer_against_pytorch_on_the_cpu():
    result = run_bench(steps=2, warmup=1, block=1, model="transformer", corpus=None,
                       torch=True)
    names = [r.name for r in result.rows]
    assert names[0] == "smallem cpu" and result.batch == 64
    assert "Transformer training step, batch 64" in format_table(result)
    if "PyTorch eager" in names:  # the same weights and batches: the same loss, to float32
        ours, theirs = result.rows
        assert abs(ours.loss - theirs.loss) < 1e-3 and ours.vs_torch == ours.ms / theirs.ms

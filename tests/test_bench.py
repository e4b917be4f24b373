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
    # the float32 CPU's kernels (numba's or NumPy's: backends/cpu/compiled.py) said on that line
    from smallem.backends.cpu import compiled

    assert result.machine["cpu kernels"].startswith(compiled.route().split("-")[0])
    assert f"CPU kernels: {result.machine['cpu kernels']}" in table


def test_bench_command_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", "--steps", "2", "--warmup", "1", "--block", "1", "--no-torch",
                 "--no-cpu64", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert {r["name"] for r in data["rows"]} >= {"smallem cpu", "hand-written NumPy"}
    assert "ms/step" in capsys.readouterr().out


def test_bench_runs_the_transformer_on_cpu(tmp_path, capsys):
    """`smallem bench --model transformer` without a GPU or PyTorch: the CPU row on the small
    model, a couple of steps at batch 4, the table and the JSON."""
    import pytest

    pytest.importorskip("smallem.models.transformer")
    result = run_bench(steps=2, warmup=1, block=1, batch=4, torch=False, model="transformer",
                       only=lambda name, device: device == "cpu")  # the same rows with a GPU
    assert [(r.name, r.device) for r in result.rows] == [("smallem cpu", "cpu")]
    row = result.rows[0]
    assert row.ms > 0 and 4.0 < row.loss < 6.5  # near ln 257 = 5.55 after two steps
    assert result.model == "transformer" and result.config["cpu"]["width"] == 64
    assert "Transformer training step, batch 4 x" in format_table(result)
    path = tmp_path / "bench.json"
    assert main(["bench", "--model", "transformer", "--steps", "1", "--warmup", "0", "--block",
                 "1", "--no-torch", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["model"] == "transformer" and "smallem cpu" in [r["name"] for r in data["rows"]]
    assert "Transformer training step" in capsys.readouterr().out


def test_step_calls_with_the_gpu_fused_set():
    """What notebook 10 counts: the MLP's tanh rule fused (3 calls become 1), and each of its
    two Linears one `linear` call each way (forward: a product and an add; rule: two products
    and a bias sum: 5 calls become 2); the Transformer's step from some 300-350 calls to under
    half, every fused rule one call."""
    from smallem.tools.bench import GPU_FUSED, NO_LAUNCH, step_calls

    def launching(**kw):
        calls, _ = step_calls("cpu", **kw)
        return sum(n for name, n in calls.items() if name not in NO_LAUNCH), calls

    mlp, _ = launching()
    mlp_fused, _ = launching(fused=GPU_FUSED)
    assert mlp_fused == mlp - 2 - 2 * 3
    reference, _ = launching(batch=2, model="transformer", fused=False)
    fused, calls = launching(batch=2, model="transformer", fused=GPU_FUSED)
    assert fused < reference / 2
    assert calls["softmax"] == calls["softmax (forward)"] == 2  # one per block, each way
    assert "sum" not in calls and "mean" not in calls  # no reference LayerNorm, no bias sums


def test_the_transformers_cpu_rows_are_titled_with_the_plan_they_ran():
    """The CPU rows time a tenth of the steps: the table says so, in words, not the GPU's plan
    and not a Python dict."""
    result = run_bench(steps=20, warmup=5, block=10, batch=2, torch=False, model="transformer",
                       only=lambda name, device: device == "cpu")
    table = format_table(result)
    plan = "median of 2 blocks of 1 steps after 3 warm-up steps"  # steps // 10, block // 10
    assert table.splitlines()[0].endswith(f"AdamW: {plan}"), table
    cpu = next(line for line in table.splitlines() if line.startswith("cpu rows:"))
    assert cpu.startswith("cpu rows: the smaller model (layers 2, width 64, heads 4, context 64, ")
    assert cpu.endswith(f"), {plan}"), table
    assert "{" not in table and "2 blocks of 10 steps" not in table


def test_each_cpu_row_is_timed_alone_in_a_process_of_its_own(monkeypatch):
    """In one process, PyTorch's CPU step shared the host with NumPy's spinning BLAS threads
    (137 ms there, 18 ms alone on the H200 host): the parent never builds a CPU row, and a row
    gets every block the title counts, shared over the rounds."""
    from smallem.tools import bench
    from smallem.tools.bench_isolated import time_rows

    real = bench.candidates

    def built_here(seed):
        raise AssertionError("a CPU row was built in the parent process")

    monkeypatch.setattr(bench, "candidates", lambda torch, cpu64: [
        (name, device, dtype, built_here if device == "cpu" else factory)
        for name, device, dtype, factory in real(torch, cpu64)])
    result = bench.run_bench(steps=2, warmup=1, block=1, torch=False, cpu64=False)
    assert {"smallem cpu", "hand-written NumPy"} <= {r.name for r in result.rows}
    drawn = bench.BatchSampler(bench.load_corpus().train, 8, 16, seed=0)
    heard = []
    seconds, loss, info = time_rows(bench._time_row, "mlp", ["hand-written NumPy"], [drawn.next()],
                                    (1, 3, 1), log=heard.append)["hand-written NumPy"]
    assert len(seconds) == 3 and 4.0 < loss < 6.5
    # each round heard as it ends, with the threads it ran on and its page faults per step
    assert len(heard) == 2 and all("ms/step in this round" in line and "page faults/step" in line
                                   for line in heard)
    assert info["threads"] >= 1 and info["faults"] >= 0


def test_the_two_hand_written_numpy_rows_are_each_timed_in_their_own_dtype(monkeypatch):
    """Both are named "hand-written NumPy" (float32 and float64): each CPU row's process must
    build its own, not the first of that name."""
    from smallem.tools import bench

    real, built = bench.candidates, []
    monkeypatch.setattr(bench, "candidates", lambda torch, cpu64: [
        (name, device, dtype, lambda s, f=factory, d=dtype: built.append(d) or f(s))
        for name, device, dtype, factory in real(torch, cpu64)])
    drawn = bench.BatchSampler(bench.load_corpus().train, 8, 16, seed=0)
    for dtype in ("float32", "float64"):
        bench._time_row("mlp", bench.row_key("hand-written NumPy", dtype), [drawn.next()], (1, 1, 1), 0)
    assert built == ["float32", "float64"]


def test_a_cpu_row_is_compared_with_pytorchs_faster_eager_row():
    """On a CPU experts run attention through SDPA where it is faster: `vs torch` there is
    against the faster of PyTorch's two eager rows; a GPU's stays plain eager's."""
    from smallem.tools.bench import Row, ratios

    rows = [Row("smallem cpu", "cpu", "float32", 150.0, 0, 0, 5.0),
            Row("PyTorch eager", "cpu", "float32", 50.0, 0, 0, 5.0),
            Row("PyTorch eager, SDPA", "cpu", "float32", 30.0, 0, 0, 5.0),
            Row("smallem gpu", "gpu", "float32", 2.0, 0, 0, 5.0),
            Row("PyTorch eager", "gpu", "float32", 4.0, 0, 0, 5.0),
            Row("PyTorch eager, SDPA", "gpu", "float32", 1.0, 0, 0, 5.0)]
    ratios(rows)
    assert rows[0].vs_torch == 5.0 and rows[3].vs_torch == 0.5

"""README's speed tables against the recorded runs they cite (issues 36 and 37).

Each figure of the round-7 and round-8 tables (the step in each precision, the bias epilogue's
step, attention alone in fp32 and bf16) is read back from the JSON named on the table's "Source:"
line, to the digits README prints, so editing one side alone fails; every run README cites under
benchmarks/results/ must exist.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from smallem.tools.bench_precision import SIZES

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = (ROOT / "README.md").read_text()
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _table(source: str, header: str) -> list[list[str]]:
    """The rows of the first table whose header starts with `header` after the Source line naming
    `source`."""
    at = README.find("Source: `benchmarks/results/" + source)
    assert at >= 0, f"README has no Source line naming {source}"
    lines = README[at:].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| " + header))
    rows = []
    for line in lines[start + 2:]:  # past the header and the | --- | line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    assert rows, f"the table '{header}' after {source} is empty"
    return rows


def _sentence_agrees(pattern: str, figures: list[float]) -> None:
    """README's sentence matching `pattern` (whitespace folded) quotes `figures`, in order, to
    the decimals it shows."""
    found = re.search(pattern, " ".join(README.split()))
    assert found, f"README has no sentence matching {pattern[:60]!r}"
    written = found.groups()
    assert len(written) == len(figures) and all(_agrees(w, v) for w, v in zip(written, figures)), \
        f"README {written}, the record {figures}"


def _numbers(cell: str) -> list[str]:
    return NUMBER.findall(cell.replace("**", ""))


def _agrees(written: str, value: float) -> bool:
    """`written` is `value` to the decimals it shows."""
    decimals = len(written.split(".")[1]) if "." in written else 0
    return abs(float(written.replace(",", "")) - value) <= 0.5 * 10 ** -decimals + 1e-9


def _check(cell: str, *values: float | None, what: str) -> None:
    if values[0] is None:
        assert cell == "-", f"{what}: README shows {cell!r} where the record has no figure"
        return
    written = _numbers(cell)
    assert len(written) >= len(values), f"{what}: {cell!r} should show {values}"
    for w, v in zip(written, values):
        assert _agrees(w, v), f"{what}: README says {w}, the record {v:.4g}"


def _size(label: str) -> tuple[str, str]:
    """('mlp' | 'transformer', the bench's size name) from README's model label."""
    if label.startswith("byte MLP"):
        return "mlp", "default"
    layers, width, context = map(int, re.match(r"Transformer (\d+) × (\d+), T (\d+)", label).groups())
    names = [n for n, c in SIZES.items() if (c.layers, c.width, c.context) == (layers, width, context)]
    assert names, f"no bench size is {label}"
    return "transformer", names[0]


def test_the_step_table_is_the_recorded_bench():
    recorded = {(row["model"], row["size"], row["precision"]): row for row in json.loads(
        (RESULTS / "round9" / "final" / "bench_precision.json").read_text())["rows"]}
    shown = set()
    for label, precision, smallem, torch, ratio, tflops in _table(
            "round9/final/bench_precision.json", "model (batch)"):
        key = (*_size(label), precision)
        assert key in recorded, f"README's row {key} is not in the recorded runs"
        row, what = recorded[key], " ".join(key)
        _check(smallem, row["smallem_ms"], what=what + " smallem ms")
        _check(torch, row["torch_ms"], what=what + " PyTorch ms")
        _check(ratio, row["ratio"], what=what + " ratio")
        _check(tflops, row["tflops"], 100 * row["peak_share"], what=what + " TFLOP/s")
        shown.add(key)
    assert shown == set(recorded), f"recorded but not in README: {sorted(set(recorded) - shown)}"



def test_the_bias_epilogue_table_is_the_recorded_bench():
    """Round 7's table (issue 36): the default and 8 × 512 Transformer's step before and with the
    bias in the product's epilogue, against PyTorch, every row of the record shown."""
    recorded = {(r["model"], r["size"], r["precision"]): r for r in json.loads(
        (RESULTS / "round7" / "bf16_epilogues_bench.json").read_text())["rows"]
        if r["model"] == "transformer"}
    shown = set()
    for label, precision, before, now, torch, ratio_before, ratio_now in _table(
            "round7/bf16_epilogues_bench.json", "model (batch)"):
        key = (*_size(label), precision)
        row, what = recorded[key], " ".join(key)
        _check(before, row["before_ms"], what=what + " before")
        _check(now, row["bias_ms"], what=what + " with the epilogue")
        _check(torch, row["torch_ms"], what=what + " PyTorch")
        _check(ratio_before, row["ratio_before"], what=what + " ratio before")
        _check(ratio_now, row["ratio_bias"], what=what + " ratio")
        shown.add(key)
    assert shown == set(recorded), f"recorded but not in README: {sorted(set(recorded) - shown)}"

def _attention(run: str = "round6") -> dict[tuple[str, int, int, str], dict]:
    rows = json.loads((RESULTS / run / "attention_h200.json").read_text())["attention"]
    return {(r["impl"], r["D"], r["T"], r["dtype"]): r for r in rows}


def _timed(cell: str, row: dict | None, what: str) -> None:
    """A time, '(eager)' exactly where the record timed it without a graph."""
    _check(cell, row and row["ms"], what=what)
    if row is not None:
        assert ("(eager)" in cell) == row["timing"].startswith("eager"), f"{what}: graph or eager?"


def _float32_rounds() -> dict[tuple[str, int, int], dict]:
    """Round 8's float32 rows: T 512 and 1,024 from its float32 call, 2,048 and 4,096 from the
    last call (README's Source line names both); the fused rows keyed by their kernels."""
    rows = {}
    for run, lengths in (("attention_f32_h200.json", (512, 1024)),
                         ("final/attention_f32_h200.json", (2048, 4096))):
        for r in json.loads((RESULTS / "round8" / run).read_text())["bench"]:
            if r["T"] in lengths:
                impl = f"fused {r['kernels']}" if r["impl"] == "smallem fused" else r["impl"]
                rows[impl, r["D"], r["T"]] = r
    return rows


def test_the_float32_attention_table_is_the_recorded_bench():
    recorded = _float32_rounds()
    assert "round8/final/attention_f32_h200.json" in README
    table = _table("round8/attention_f32_h200.json", "fp32: D, T")
    for dt, flash, rows, unfused, sdpa, ratio, device in table:
        d, t = (int(x.replace(",", "")) for x in dt.split(", "))
        get = lambda impl: recorded.get((impl, d, t))  # noqa: E731
        what = f"fp32 D {d} T {t}"
        _timed(flash, get("fused flash"), what + " flash")
        _timed(rows, get("fused rows"), what + " rows")
        _timed(unfused, get("smallem unfused"), what + " unfused")
        _timed(sdpa, get("PyTorch SDPA default"), what + " SDPA")
        _check(ratio, get("fused flash")["vs_sdpa"], what=what + " ratio")
        _check(device, get("fused flash")["device_bytes"] / 2**20,
               get("PyTorch SDPA default")["device_bytes"] / 2**20, what=what + " device MiB")
    assert len(table) == len({k for k in recorded if k[0] == "fused flash"}) == 12


def test_the_round11_float32_attention_rows_are_the_recorded_bench():
    """Round 11's float32 table: every smallem row of the bench, PyTorch's beside where the record
    has it ("-" where it has none: D 128, T 4,096 in that call)."""
    source = "round11/attention_f32_bench/bench_fp32.json"
    rows = json.loads((RESULTS / source).read_text())["attention"]
    recorded = {(r["impl"], r["D"], r["T"]): r for r in rows}
    table = _table(source, "fp32 round 11: D, T")
    for dt, flash, sdpa, ratio, tflops, device in table:
        d, t = (int(x.replace(",", "")) for x in dt.split(", "))
        mine, theirs = recorded[("smallem fused", d, t)], recorded.get(("PyTorch SDPA default", d, t))
        what = f"fp32 round 11 D {d} T {t}"
        _timed(flash, mine, what + " flash")
        if theirs is None:
            assert sdpa == ratio == "-" and tflops.endswith(", -"), what + ": no PyTorch row recorded"
            _check(tflops.split(",")[0], mine["tflops"], what=what + " TFLOP/s")
            continue
        _timed(sdpa, theirs, what + " SDPA")
        _check(ratio, mine["vs_sdpa"], what=what + " ratio")
        _check(tflops, mine["tflops"], theirs["tflops"], what=what + " TFLOP/s")
        _check(device, mine["device_bytes"] / 2**20, theirs["device_bytes"] / 2**20,
               what=what + " device MiB")
    assert len(table) == len({k for k in recorded if k[0] == "smallem fused"}) == 12


@pytest.mark.parametrize("source, rows", [("round9/final/attention_bench_d64.json", 3),
                                          ("round10/final/attention_h200.json", 3),
                                          ("round11/final/attention_bf16_nvrtc.json", 3),
                                          ("round13/final/attention_h200.json", 3)])
def test_the_bf16_attention_rows_of_a_round_are_the_recorded_bench(source, rows):
    """Round 9's, 10's, 11's and 13's bf16 tables (round 10's with the untiled key kernel's time
    beside, from the same process; round 13's record keeps its rows by precision)."""
    record = json.loads((RESULTS / source).read_text())
    recorded = {(r["impl"], r["T"]): r for r in record.get("attention", record.get("bf16"))
                if r["dtype"] == "bf16"}
    untiled = {r["T"]: r for r in record.get("not_tiled", []) if r["impl"] == "smallem fused"}
    table = _table(source, "bf16: D, T")
    for dt, smallem, *cells in table:
        cudnn, flash, ratio, tflops, device = cells[-5:]
        t = int(dt.split(", ")[1].replace(",", ""))
        if untiled:
            _timed(cells[0], untiled[t], f"{source} bf16 T {t} untiled")
        t = int(dt.split(", ")[1].replace(",", ""))
        ours, default = recorded["smallem fused", t], recorded["PyTorch SDPA default", t]
        what = f"{source} bf16 T {t}"
        _timed(smallem, ours, what + " smallem")
        _timed(cudnn, default, what + " cuDNN")
        _timed(flash, recorded["PyTorch SDPA flash", t], what + " flash")
        _check(ratio, ours["vs_sdpa"], what=what + " ratio")
        _check(tflops, ours["tflops"], default["tflops"], what=what + " TFLOP/s")
        _check(device, ours["device_bytes"] / 2**20, default["device_bytes"] / 2**20, what=what + " MiB")
    assert len(table) == rows


def test_the_bf16_attention_table_is_the_recorded_bench():
    recorded = _attention("round7")  # round 7's tensor-core kernels (attention_mma.py)
    table = _table("round7/attention_h200.json", "bf16: D, T")
    for dt, smallem, cudnn, flash, ratio, tflops, device in table:
        d, t = (int(x.replace(",", "")) for x in dt.split(", "))
        get = lambda impl: recorded[(impl, d, t, "bf16")]  # noqa: E731
        what = f"bf16 D {d} T {t}"
        ours, default = get("smallem fused"), get("PyTorch SDPA default")
        # README names PyTorch's default choice cuDNN: the record's default row is its cuDNN row.
        assert abs(default["ms"] / get("PyTorch SDPA cudnn")["ms"] - 1) < 0.03, what
        _timed(smallem, ours, what + " smallem")
        _timed(cudnn, default, what + " cuDNN")
        _timed(flash, get("PyTorch SDPA flash"), what + " flash")
        _check(ratio, ours["vs_sdpa"], what=what + " ratio")
        _check(tflops, ours["tflops"], default["tflops"], what=what + " TFLOP/s")
        _check(device, ours["device_MiB"], default["device_MiB"], what=what + " device MiB")


CITED = sorted(set(re.findall(r"`(?:benchmarks/results/)?(round\d/[^`\s]+)`", README)))


@pytest.mark.parametrize("cited", CITED)
def test_every_run_readme_cites_is_recorded(cited):
    assert list(RESULTS.glob(cited)), f"README cites {cited}, which benchmarks/results/ does not hold"


def test_the_held_out_row_is_the_recorded_runs():
    """Issue 36's last target: README's held-out losses per precision are the recorded runs'
    (round 9's bf16 and fp32 on the merged main; round 8's four precisions)."""
    row = next(line for line in README.splitlines() if line.startswith("| default 10,000-step run"))
    cell = row.split("|")[2]
    now = {p: json.loads((RESULTS / "round9" / "final" / f"heldout_{p}.json").read_text())["held_out_loss"]
           for p in ("bf16", "fp32")}
    bf16, fp32, delta = re.match(r" round 9: ([\d.]+) against ([\d.]+) \(\+([\d.]+)", cell).groups()
    assert _agrees(bf16, now["bf16"]) and _agrees(fp32, now["fp32"]), f"round 9: README {bf16}, {fp32}"
    assert _agrees(delta, now["bf16"] - now["fp32"]) and abs(now["bf16"] - now["fp32"]) <= 0.01
    recorded = json.loads((RESULTS / "round8" / "call1" / "heldout.json").read_text())
    before = cell.split("round 8:")[1]
    bf16, fp32, delta = re.match(r" ([\d.]+) against ([\d.]+) \(\+([\d.]+)", before).groups()
    fp16, tf32 = (re.search(name + r" ([\d.]+)", before).group(1) for name in ("fp16", "tf32"))
    for written, name in ((bf16, "bf16"), (fp32, "fp32"), (fp16, "fp16"), (tf32, "tf32")):
        assert _agrees(written, recorded[name]["held_out_loss"]), f"{name}: README {written}"
    assert _agrees(delta, recorded["bf16"]["vs_fp32"])
    assert row.rstrip().endswith("| met |")


def test_the_tf32_seeds_prose_is_the_recorded_runs():
    """TF32's held-out loss over three seeds against fp32's, as README's prose quotes them."""
    tf32 = [json.loads((RESULTS / "round8" / "call1" / "heldout.json").read_text())["tf32"]["held_out_loss"]]
    tf32 += [json.loads((RESULTS / "round9" / "final" / f"heldout_tf32_seed{s}.json").read_text())
             ["held_out_loss"] for s in (1, 2)]
    fp32 = [json.loads((RESULTS / "round8" / "call1" / "heldout.json").read_text())["fp32"]["held_out_loss"]]
    fp32 += [json.loads((RESULTS / "round8" / "final" / f"heldout_fp32_seed{s}.json").read_text())
             ["held_out_loss"] for s in (1, 2)]
    text = " ".join(README.split())
    assert f"{tf32[0]:.4f}, {tf32[1]:.4f} and {tf32[2]:.4f} (seeds 0, 1, 2" in text
    assert f"against fp32's {fp32[0]:.4f}, {fp32[1]:.4f} and {fp32[2]:.4f}" in text
    gaps = [f"+{t - f:.3f}" for t, f in zip(tf32, fp32)]
    assert f"{gaps[0]}, {gaps[1]} and {gaps[2]} above fp32" in text
    spreads = f"({max(tf32) - min(tf32):.3f} against {max(fp32) - min(fp32):.3f})"
    assert spreads in text


def test_the_step_prose_ranges_are_the_recorded_bench():
    """The ranges README's prose quotes under the step table, computed from the same record: fp32
    and tf32 against PyTorch at every Transformer size, and bf16 as a share of smallem's tf32."""
    rows = {(r["size"], r["precision"]): r for r in json.loads(
        (RESULTS / "round9" / "final" / "bench_precision.json").read_text())["rows"]
        if r["model"] == "transformer"}
    sizes = {size for size, _ in rows}
    ratios = [rows[s, p]["ratio"] for s in sizes for p in ("fp32", "tf32")]
    shares = [rows[s, "bf16"]["smallem_ms"] / rows[s, "tf32"]["smallem_ms"] for s in sizes]
    assert f"at every size ({min(ratios):.2f}-{max(ratios):.2f}×;" in README
    assert f"at every size ({min(shares):.2f}-{max(shares):.2f} of it)" in README


def test_the_round9_cpu_sentence_is_the_recorded_host_call():
    """README's figures for round 9's compiled Linears on the H200 host's CPU, each row alone
    (benchmarks/cpu_nogil_device.sh), read back from the call's rows."""
    rows = [json.loads(line) for line in
            (RESULTS / "round9" / "cpu2" / "cpu_nogil.jsonl").read_text().splitlines() if line.strip()]
    ms = {r["asked"]: r["ms"] for r in rows}
    get = lambda threads, pin, linear, row="smallem cpu": ms[  # noqa: E731
        f"{row}, {threads} threads, {pin}, grain 8, linear {linear}"]
    figures = [get(16, "unpinned", "numba"), get(16, "unpinned", "numpy"), get(8, "unpinned", "numba"),
               get(16, "unpinned", "numba", "PyTorch eager, SDPA"), get(1, "0", "numba"),
               get(1, "0", "numpy"), get(1, "0", "numba", "PyTorch eager, SDPA")]
    pattern = (r"the step took ([\d.]+) ms at 16 threads against ([\d.]+) with NumPy's calls and ([\d.]+) "
               r"at 8, PyTorch SDPA ([\d.]+) ms, and ([\d.]+) against ([\d.]+) on one core, PyTorch "
               r"([\d.]+), in one call")
    _sentence_agrees(pattern, figures)


def test_the_round10_cpu_sentence_is_the_recorded_interleaved_call():
    """README's figures for round 10's merged CPU engine against round 9's tree on the H200 host's
    CPU, rows alone and interleaved (benchmarks/round10_final2.sh), read back from the call's rows."""
    record = RESULTS / "round10" / "final" / "cpu_interleaved.jsonl"
    rows = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    ms = {r["asked"]: r["ms"] for r in rows}
    figures = [ms["main 1 pinned (1)"], ms["main 1 pinned (2)"], ms["round 9 1 pinned (1)"],
               ms["round 9 1 pinned (2)"], ms["PyTorch SDPA 1 pinned"],
               *(ms[f"main 16 ({i})"] for i in (1, 2, 3)), *(ms[f"round 9 16 ({i})"] for i in (1, 2, 3)),
               ms["PyTorch SDPA 16"], ms["main 16, pool off (1)"], ms["main 16, pool off (2)"]]
    pattern = (r"on one pinned core the step took ([\d.]+) and ([\d.]+) ms against round 9's ([\d.]+) and "
               r"([\d.]+), PyTorch SDPA ([\d.]+) .*? at 16 threads ([\d.]+), ([\d.]+) and ([\d.]+) against "
               r"round 9's ([\d.]+), ([\d.]+) and ([\d.]+), PyTorch SDPA ([\d.]+) .*? the pool off, "
               r"([\d.]+) and ([\d.]+)\.")
    _sentence_agrees(pattern, figures)
    text = " ".join(README.split())
    ratios = re.search(r"PyTorch SDPA [\d.]+ \(([\d.]+)-([\d.]+)×, issue 38", text).groups()
    one_core = [figures[0] / figures[4], figures[1] / figures[4]]
    assert _agrees(ratios[0], min(one_core)) and _agrees(ratios[1], max(one_core))


def test_the_round11_cpu_sentence_is_the_recorded_call():
    """README's figures for round 11's CPU engine (helpers asleep in the pool's loop) against
    main's tree on the H200 host's CPU, each row alone and interleaved (benchmarks/r11-cpu16_device.sh
    PART=2), and the one-thread GEMMs side by side (PART=1), read back from the calls' records."""
    folder = RESULTS / "round11" / "cpu16"
    rows = [json.loads(line) for line in (folder / "call2" / "rows.jsonl").read_text().splitlines()
            if line.strip()]
    ms: dict[str, list[float]] = {}
    for r in rows:
        ms.setdefault(r["asked"].strip(), []).append(r["ms"])
    conc = {(r["route"], r["threads"], r["shape"]): r["us per call"] for r in
            (json.loads(line) for line in (folder / "call1" / "conc.jsonl").read_text().splitlines())
            if "route" in r}
    piece = "256x64 @ 64x64"
    branch16 = ms["smallem cpu, 16 threads, unpinned, r11-cpu16"]
    torch16 = ms["PyTorch eager, SDPA, 16 threads, unpinned, r11-cpu16"][0]
    figures = [conc["openblas loop", 16, piece], conc["openblas loop", 1, piece],
               conc["numpy matmul", 16, piece], *branch16,
               *ms["smallem cpu, 16 threads, unpinned, base"], torch16,
               min(branch16) / torch16, max(branch16) / torch16,
               ms["smallem cpu, 2 threads, 0,1, r11-cpu16"][0],
               ms["PyTorch eager, SDPA, 2 threads, 0,1, r11-cpu16"][0]]
    pattern = (r"ran at ([\d.]+) µs a call against ([\d.]+) alone, and at ([\d.]+) through np.matmul .*? "
               r"the step took ([\d.]+) and ([\d.]+) ms at 16 threads against ([\d.]+) and ([\d.]+), "
               r"PyTorch SDPA ([\d.]+) \(([\d.]+)-([\d.]+)×; .*?\(two pinned cores ([\d.]+) ms, PyTorch SDPA "
               r"([\d.]+)\)")
    _sentence_agrees(pattern, figures)


def test_the_round11_pool_jobs_sentence_is_the_recorded_call():
    """README's figures for the table's blocks as jobs of the pool (round11/cpu16b.md: the lead's
    host call, each row alone and interleaved) and the one-core rows of cpu16's second call."""
    def rows(path: str) -> dict[str, list[float]]:
        ms: dict[str, list[float]] = {}
        for line in (RESULTS / "round11" / path).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                ms.setdefault(r["asked"].strip(), []).append(r["ms"])
        return ms
    jobs = rows("cpu16b/logs/rows.jsonl")
    on = jobs["smallem cpu, 16 threads, unpinned, r11-cpu16b SMALLEM_POOL_JOBS=1"]
    torch16 = jobs["PyTorch eager, SDPA, 16 threads, unpinned, r11-cpu16b"][0]
    one = rows("cpu16/call2/rows.jsonl")
    main1 = one["smallem cpu, 1 threads, 0, base"][0]
    torch1 = one["PyTorch eager, SDPA, 1 threads, 0, r11-cpu16"][0]
    figures = [*on, *jobs["smallem cpu, 16 threads, unpinned, r11-cpu16b SMALLEM_POOL_JOBS=0"], torch16,
               min(on) / torch16, max(on) / torch16, main1, torch1, main1 / torch1]
    pattern = (r"took ([\d.]+), ([\d.]+) and ([\d.]+) ms at 16 threads with them against ([\d.]+) and "
               r"([\d.]+) without, PyTorch SDPA ([\d.]+) \(([\d.]+)-([\d.]+)×\)\. In the earlier call one "
               r"pinned core ran main at ([\d.]+) ms against PyTorch SDPA's ([\d.]+) \(([\d.]+)×")
    _sentence_agrees(pattern, figures)


def test_the_mlp_cpu_table_is_the_recorded_bench():
    """Round 10's MLP rows on the host's CPU (`smallem bench --model mlp`, each row alone), one
    bench JSON per thread count, every one shown."""
    files = {"16": "mlp_16.json", "2 pinned cores": "mlp_2.json"}
    shown = set()
    for label, smallem, hand, torch, ratio in _table("round10/cpu_kernels/mlp_{16,2}.json",
                                                     "threads (MLP"):
        record = json.loads((RESULTS / "round10" / "cpu_kernels" / files[label]).read_text())
        rows = {r["name"]: r for r in record["rows"]}
        assert record["model"] == "mlp" and rows["smallem cpu"]["threads"] == int(label.split()[0])
        _check(smallem, rows["smallem cpu"]["ms"], what=f"MLP {label} smallem")
        _check(hand, rows["hand-written NumPy"]["ms"], what=f"MLP {label} hand-written")
        _check(torch, rows["PyTorch eager"]["ms"], what=f"MLP {label} PyTorch")
        _check(ratio, rows["smallem cpu"]["vs_torch"], what=f"MLP {label} ratio")
        shown.add(files[label])
    assert shown == set(files.values())


def test_the_round10_cpu_sentence_is_the_recorded_host_call():
    """README's figures for round 10's attention in BLAS on the host's CPU, each row alone
    (benchmarks/cpu_round10_kernels.sh), read back from the call's rows."""
    rows = [json.loads(line) for line in (RESULTS / "round10" / "cpu_kernels" / "cpu_round10.jsonl")
            .read_text().splitlines() if line.strip()]
    ms = {r["asked"]: r["ms"] for r in rows}
    get = lambda row, tree, at: ms[f"{row}, {tree}, {at}"]  # noqa: E731
    sixteen, two = "16 threads, unpinned", "2 threads, 0,1"
    figures = [get("smallem cpu", "branch", sixteen), get("smallem cpu", "base", sixteen),
               get("PyTorch eager, SDPA", "branch", sixteen),
               get("smallem cpu", "branch", sixteen) / get("PyTorch eager, SDPA", "branch", sixteen),
               get("smallem cpu", "branch", two), get("smallem cpu", "base", two),
               get("PyTorch eager, SDPA", "branch", two),
               get("smallem cpu", "branch", two) / get("PyTorch eager, SDPA", "branch", two)]
    pattern = (r"the step took ([\d.]+) ms at 16 threads against ([\d.]+) for round 9's engine \(PyTorch "
               r"SDPA ([\d.]+) ms: ([\d.]+)×\) and ([\d.]+) against ([\d.]+) on two pinned cores \(PyTorch "
               r"SDPA ([\d.]+) ms: ([\d.]+)×")
    _sentence_agrees(pattern, figures)


def test_the_round13_cpu_sentence_is_the_recorded_call():
    """README's figures for round 13's re-measure on the H200 host's CPU (each row alone, this tree
    and main's interleaved, two rounds: benchmarks/r11-cpu16_device.sh PART=3) and the step by op,
    smallem's and PyTorch's, read back from round13/cpu/call1."""
    folder = RESULTS / "round13" / "cpu" / "call1"
    ms: dict[str, list[float]] = {}
    for line in (folder / "rows.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            ms.setdefault(r["asked"].strip(), []).append(r["ms"])
    ops = {r["asked"]: r for r in (json.loads(line) for line in
                                   (folder / "ops.jsonl").read_text().splitlines() if line.strip())}
    mine, torch = ops["ops, 16 threads"], ops["torch-ops, 16 threads"]
    figures = []
    for threads, pin in ((16, "unpinned"), (2, "0,1"), (1, "0")):
        here = ms[f"smallem cpu, {threads} threads, {pin}, r13-cpu"]
        sdpa = ms[f"PyTorch eager, SDPA, {threads} threads, {pin}, r13-cpu"]
        ratios = [a / b for a, b in zip(here, sdpa)]
        figures += [*here, *ms[f"smallem cpu, {threads} threads, {pin}, main"], *sdpa, min(ratios),
                    max(ratios)]
    figures += [mine["forward attention"] + mine["rule attention"],
                torch["aten::_scaled_dot_product_flash_attention_for_cpu"]
                + torch["aten::_scaled_dot_product_flash_attention_for_cpu_backward"],
                sum(mine[k] for k in ("forward linear", "forward linear_add", "rule linear",
                                      "rule linear_add")),
                torch["aten::mm"] + torch["aten::addmm"]]
    n = r"([\d.]+)"
    pattern = (rf"at 16 threads {n} and {n} ms against main's {n} and {n}, PyTorch SDPA {n} and {n} "
               rf"\({n}-{n}×\); two pinned cores {n} and {n} against {n} and {n}, PyTorch SDPA {n} and "
               rf"{n} \({n}-{n}×\); one pinned core {n} and {n} against {n} and {n}, PyTorch SDPA {n} "
               rf"and {n} \({n}-{n}×\).*? the attention takes {n} ms where PyTorch's SDPA takes {n} .*?, "
               rf"the Linears {n} against {n}:")
    _sentence_agrees(pattern, figures)


def test_the_round13_attention_rows_sentence_is_the_recorded_call():
    """README's figures for the attention alone with 16 and 64 queries a product (round13/cpu/call2,
    benchmarks/r13_cpu_attention.py on the host)."""
    ms = {r["asked"].strip(): r["ms"] for r in (
        json.loads(line) for line in
        (RESULTS / "round13" / "cpu" / "call2" / "attention.jsonl").read_text().splitlines()
        if line.strip())}
    figures = [ms["attention, 16 threads"], ms["attention, 16 threads SMALLEM_ATTENTION_ROWS=64"],
               ms["attention, 1 threads"], ms["attention, 1 threads SMALLEM_ATTENTION_ROWS=64"]]
    n = r"([\d.]+)"
    _sentence_agrees(rf"took the attention alone from {n} to {n} ms at 16 threads, and from {n} to {n} ms "
                     r"on one core", figures)


def test_the_round13_step_with_64_queries_sentence_is_the_recorded_call():
    """README's figures for the 16-thread step with 64 and 16 queries a product and PyTorch SDPA's
    (round13/final/cpu: the lead's last call, each row alone)."""
    rows = [json.loads(line) for line in
            (RESULTS / "round13" / "final" / "cpu" / "logs" / "rows.jsonl").read_text().splitlines()
            if line.strip()]
    ms = {r["asked"].strip(): r["ms"] for r in rows}
    ours, sixteen = ms["smallem cpu, 16 threads, unpinned, main"], \
        ms["smallem cpu, 16 threads, unpinned, main SMALLEM_ATTENTION_ROWS=16"]
    torch = ms["PyTorch eager, SDPA, 16 threads, unpinned, main"]
    n = r"([\d.]+)"
    _sentence_agrees(rf"the step took {n} ms at 16 threads with it against {n} with 16 queries a product, "
                     rf"PyTorch SDPA {n} \({n}×", [ours, sixteen, torch, ours / torch])


def test_the_round13_float32_attention_rows_are_the_recorded_bench():
    """Round 13's float32 table: D 64, 128 from the float32 call (3xTF32 tiles adopted in it), D 32
    from the last call; the units each row names are the record's."""
    rows = json.loads((RESULTS / "round13/f32/lead_call/r13_f32.json").read_text())["bench"] + \
        json.loads((RESULTS / "round13/final/attention_h200.json").read_text())["fp32"]
    recorded = {(r["impl"], r["D"], r["T"]): r for r in rows}
    table = _table("round13/f32/lead_call/r13_f32.json", "fp32 round 13: D, T")
    for dt, flash, units, sdpa, ratio, tflops, device in table:
        d, t = (int(x.replace(",", "")) for x in dt.split(", "))
        mine, theirs = recorded[("smallem fused", d, t)], recorded[("PyTorch SDPA default", d, t)]
        what = f"fp32 round 13 D {d} T {t}"
        assert units == mine["units"], what + " units"
        _timed(flash, mine, what + " flash")
        _timed(sdpa, theirs, what + " SDPA")
        _check(ratio, mine["vs_sdpa"], what=what + " ratio")
        _check(tflops, mine["tflops"], theirs["tflops"], what=what + " TFLOP/s")
        _check(device, mine["device_bytes"] / 2**20, theirs["device_bytes"] / 2**20,
               what=what + " device MiB")
    assert len(table) == len({k for k in recorded if k[0] == "smallem fused"}) == 12

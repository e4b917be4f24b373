"""benchmarks/NOTES.md's "History of the speed figures" against the records it cites: README's
Speed section of rounds 3-13, moved there in round 14 in its own words, keeps being read back
figure by figure as README's was (the step with the bias epilogue, attention alone in fp32 and
bf16 round by round, the CPU engine's host calls), so editing one side alone fails; every run it
cites under benchmarks/results/ must exist.
"""

from __future__ import annotations

import json
import re

import pytest
from speed_records import (
    HISTORY,
    RESULTS,
    agrees,
    asked,
    bf16_table,
    check,
    cited,
    cpu_table,
    fastest,
    float32_table,
    folded,
    jsonl,
    mlp_table,
    ratios_and_target,
    sentence_agrees,
    size,
    step_table,
    table,
    timed,
)

N = r"([\d.]+)"


def test_the_bias_epilogue_table_is_the_recorded_bench():
    """Round 7's table (issue 36): the default and 8 × 512 Transformer's step before and with the
    bias in the product's epilogue, against PyTorch, every row of the record shown."""
    recorded = {(r["model"], r["size"], r["precision"]): r for r in json.loads(
        (RESULTS / "round7" / "bf16_epilogues_bench.json").read_text())["rows"]
        if r["model"] == "transformer"}
    shown = set()
    for label, precision, before, now, torch, ratio_before, ratio_now in table(
            "round7/bf16_epilogues_bench.json", "model (batch)", HISTORY):
        key = (*size(label), precision)
        row, what = recorded[key], " ".join(key)
        check(before, row["before_ms"], what=what + " before")
        check(now, row["bias_ms"], what=what + " with the epilogue")
        check(torch, row["torch_ms"], what=what + " PyTorch")
        check(ratio_before, row["ratio_before"], what=what + " ratio before")
        check(ratio_now, row["ratio_bias"], what=what + " ratio")
        shown.add(key)
    assert shown == set(recorded), f"recorded but not shown: {sorted(set(recorded) - shown)}"


def test_the_round9_step_table_is_the_recorded_bench():
    step_table("round9/final/bench_precision.json", HISTORY)


def test_the_step_prose_ranges_of_round9_are_the_recorded_bench():
    """The ranges round 9's prose quoted under the step table (fp32 and tf32 against PyTorch,
    bf16 as a share of smallem's tf32), computed from the record."""
    rows = {(r["size"], r["precision"]): r for r in json.loads(
        (RESULTS / "round9" / "final" / "bench_precision.json").read_text())["rows"]
        if r["model"] == "transformer"}
    sizes = {s for s, _ in rows}
    ratios = [rows[s, p]["ratio"] for s in sizes for p in ("fp32", "tf32")]
    shares = [rows[s, "bf16"]["smallem_ms"] / rows[s, "tf32"]["smallem_ms"] for s in sizes]
    assert f"at every size ({min(ratios):.2f}-{max(ratios):.2f}×;" in HISTORY
    assert f"at every size ({min(shares):.2f}-{max(shares):.2f} of it)" in HISTORY


def test_the_held_out_row_of_round9_and_round8_is_the_recorded_runs():
    """Issue 36's held-out row as round 9 wrote it: round 9's bf16 and fp32 on the merged main,
    then round 8's four precisions."""
    row = next(line for line in HISTORY.splitlines() if line.startswith("| default 10,000-step run"))
    cell = row.split("|")[2]
    now = {p: json.loads((RESULTS / "round9" / "final" / f"heldout_{p}.json").read_text())["held_out_loss"]
           for p in ("bf16", "fp32")}
    bf16, fp32, delta = re.match(r" round 9: ([\d.]+) against ([\d.]+) \(\+([\d.]+)", cell).groups()
    assert agrees(bf16, now["bf16"]) and agrees(fp32, now["fp32"]), f"round 9: {bf16}, {fp32}"
    assert agrees(delta, now["bf16"] - now["fp32"])
    recorded = json.loads((RESULTS / "round8" / "call1" / "heldout.json").read_text())
    before = cell.split("round 8:")[1]
    bf16, fp32, delta = re.match(r" ([\d.]+) against ([\d.]+) \(\+([\d.]+)", before).groups()
    fp16, tf32 = (re.search(name + r" ([\d.]+)", before).group(1) for name in ("fp16", "tf32"))
    for written, name in ((bf16, "bf16"), (fp32, "fp32"), (fp16, "fp16"), (tf32, "tf32")):
        assert agrees(written, recorded[name]["held_out_loss"]), f"{name}: {written}"
    assert agrees(delta, recorded["bf16"]["vs_fp32"])


def _float32_rounds() -> dict[tuple[str, int, int], dict]:
    """Round 8's float32 rows: T 512 and 1,024 from its float32 call, 2,048 and 4,096 from the
    last call (the Source line names both); the fused rows keyed by their kernels."""
    rows = {}
    for run, lengths in (("attention_f32_h200.json", (512, 1024)),
                         ("final/attention_f32_h200.json", (2048, 4096))):
        for r in json.loads((RESULTS / "round8" / run).read_text())["bench"]:
            if r["T"] in lengths:
                impl = f"fused {r['kernels']}" if r["impl"] == "smallem fused" else r["impl"]
                rows[impl, r["D"], r["T"]] = r
    return rows


def test_the_round8_float32_attention_table_is_the_recorded_bench():
    recorded = _float32_rounds()
    assert "round8/final/attention_f32_h200.json" in HISTORY
    rows = table("round8/attention_f32_h200.json", "fp32: D, T", HISTORY)
    for dt, flash, kept, unfused, sdpa, ratio, device in rows:
        d, t = (int(x.replace(",", "")) for x in dt.split(", "))
        get = lambda impl: recorded.get((impl, d, t))  # noqa: E731
        what = f"fp32 D {d} T {t}"
        timed(flash, get("fused flash"), what + " flash")
        timed(kept, get("fused rows"), what + " rows")
        timed(unfused, get("smallem unfused"), what + " unfused")
        timed(sdpa, get("PyTorch SDPA default"), what + " SDPA")
        check(ratio, get("fused flash")["vs_sdpa"], what=what + " ratio")
        check(device, get("fused flash")["device_bytes"] / 2**20,
              get("PyTorch SDPA default")["device_bytes"] / 2**20, what=what + " device MiB")
    assert len(rows) == len({k for k in recorded if k[0] == "fused flash"}) == 12


def test_the_round11_float32_attention_rows_are_the_recorded_bench():
    """Round 11's float32 table: every smallem row of the bench, PyTorch's beside where the record
    has it ("-" where it has none: D 128, T 4,096 in that call)."""
    source = "round11/attention_f32_bench/bench_fp32.json"
    recorded = {(r["impl"], r["D"], r["T"]): r
                for r in json.loads((RESULTS / source).read_text())["attention"]}
    rows = table(source, "fp32 round 11: D, T", HISTORY)
    for dt, flash, sdpa, ratio, tflops, device in rows:
        d, t = (int(x.replace(",", "")) for x in dt.split(", "))
        mine, theirs = recorded[("smallem fused", d, t)], recorded.get(("PyTorch SDPA default", d, t))
        what = f"fp32 round 11 D {d} T {t}"
        timed(flash, mine, what + " flash")
        if theirs is None:
            assert sdpa == ratio == "-" and tflops.endswith(", -"), what + ": no PyTorch row recorded"
            check(tflops.split(",")[0], mine["tflops"], what=what + " TFLOP/s")
            continue
        timed(sdpa, theirs, what + " SDPA")
        check(ratio, mine["vs_sdpa"], what=what + " ratio")
        check(tflops, mine["tflops"], theirs["tflops"], what=what + " TFLOP/s")
        check(device, mine["device_bytes"] / 2**20, theirs["device_bytes"] / 2**20,
              what=what + " device MiB")
    assert len(rows) == len({k for k in recorded if k[0] == "smallem fused"}) == 12


@pytest.mark.parametrize("source", ["round9/final/attention_bench_d64.json",
                                    "round10/final/attention_h200.json",
                                    "round11/final/attention_bf16_nvrtc.json"])
def test_the_bf16_attention_rows_of_a_round_are_the_recorded_bench(source):
    """Round 9's, 10's and 11's bf16 tables at D 64 (round 10's with the untiled key kernel's
    time beside, from the same process)."""
    record = json.loads((RESULTS / source).read_text())
    recorded = {(r["impl"], r["T"]): r for r in record["attention"] if r["dtype"] == "bf16"}
    untiled = {r["T"]: r for r in record.get("not_tiled", []) if r["impl"] == "smallem fused"}
    rows = table(source, "bf16: D, T", HISTORY)
    for dt, smallem, *cells in rows:
        cudnn, flash, ratio, tflops, device = cells[-5:]
        t = int(dt.split(", ")[1].replace(",", ""))
        if untiled:
            timed(cells[0], untiled[t], f"{source} bf16 T {t} untiled")
        ours, default = recorded["smallem fused", t], recorded["PyTorch SDPA default", t]
        what = f"{source} bf16 T {t}"
        timed(smallem, ours, what + " smallem")
        timed(cudnn, default, what + " cuDNN")
        timed(flash, recorded["PyTorch SDPA flash", t], what + " flash")
        check(ratio, ours["vs_sdpa"], what=what + " ratio")
        check(tflops, ours["tflops"], default["tflops"], what=what + " TFLOP/s")
        check(device, ours["device_bytes"] / 2**20, default["device_bytes"] / 2**20, what=what + " MiB")
    assert len(rows) == 3


def test_the_round7_bf16_attention_table_is_the_recorded_bench():
    rows = json.loads((RESULTS / "round7" / "attention_h200.json").read_text())["attention"]
    recorded = {(r["impl"], r["D"], r["T"], r["dtype"]): r for r in rows}
    for dt, smallem, cudnn, flash, ratio, tflops, device in table(
            "round7/attention_h200.json", "bf16: D, T", HISTORY):
        d, t = (int(x.replace(",", "")) for x in dt.split(", "))
        get = lambda impl: recorded[(impl, d, t, "bf16")]  # noqa: E731
        what = f"bf16 D {d} T {t}"
        ours, default = get("smallem fused"), get("PyTorch SDPA default")
        # the text names PyTorch's default choice cuDNN: the record's default row is its cuDNN row
        assert abs(default["ms"] / get("PyTorch SDPA cudnn")["ms"] - 1) < 0.03, what
        timed(smallem, ours, what + " smallem")
        timed(cudnn, default, what + " cuDNN")
        timed(flash, get("PyTorch SDPA flash"), what + " flash")
        check(ratio, ours["vs_sdpa"], what=what + " ratio")
        check(tflops, ours["tflops"], default["tflops"], what=what + " TFLOP/s")
        check(device, ours["device_MiB"], default["device_MiB"], what=what + " device MiB")


@pytest.mark.parametrize("record", cited(HISTORY))
def test_every_run_the_history_cites_is_recorded(record):
    assert list(RESULTS.glob(record)), f"NOTES.md cites {record}, which benchmarks/results/ does not hold"


def test_the_round9_cpu_sentence_is_the_recorded_host_call():
    """Round 9's compiled Linears on the H200 host's CPU, each row alone
    (benchmarks/cpu_nogil_device.sh), read back from the call's rows."""
    ms = {r["asked"]: r["ms"] for r in jsonl(RESULTS / "round9" / "cpu2" / "cpu_nogil.jsonl")}
    get = lambda threads, pin, linear, row="smallem cpu": ms[  # noqa: E731
        f"{row}, {threads} threads, {pin}, grain 8, linear {linear}"]
    figures = [get(16, "unpinned", "numba"), get(16, "unpinned", "numpy"), get(8, "unpinned", "numba"),
               get(16, "unpinned", "numba", "PyTorch eager, SDPA"), get(1, "0", "numba"),
               get(1, "0", "numpy"), get(1, "0", "numba", "PyTorch eager, SDPA")]
    pattern = (r"the step took ([\d.]+) ms at 16 threads against ([\d.]+) with NumPy's calls and ([\d.]+) "
               r"at 8, PyTorch SDPA ([\d.]+) ms, and ([\d.]+) against ([\d.]+) on one core, PyTorch "
               r"([\d.]+), in one call")
    sentence_agrees(pattern, figures, HISTORY)


def test_the_round10_cpu_sentence_is_the_recorded_host_call():
    """Round 10's attention in BLAS on the host's CPU, each row alone
    (benchmarks/cpu_round10_kernels.sh), read back from the call's rows."""
    ms = {r["asked"]: r["ms"] for r in jsonl(RESULTS / "round10" / "cpu_kernels" / "cpu_round10.jsonl")}
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
    sentence_agrees(pattern, figures, HISTORY)


def test_the_round10_cpu_sentence_is_the_recorded_interleaved_call():
    """Round 10's merged CPU engine against round 9's tree on the H200 host's CPU, rows alone and
    interleaved (benchmarks/round10_final2.sh), read back from the call's rows."""
    ms = {r["asked"]: r["ms"] for r in jsonl(RESULTS / "round10" / "final" / "cpu_interleaved.jsonl")}
    figures = [ms["main 1 pinned (1)"], ms["main 1 pinned (2)"], ms["round 9 1 pinned (1)"],
               ms["round 9 1 pinned (2)"], ms["PyTorch SDPA 1 pinned"],
               *(ms[f"main 16 ({i})"] for i in (1, 2, 3)), *(ms[f"round 9 16 ({i})"] for i in (1, 2, 3)),
               ms["PyTorch SDPA 16"], ms["main 16, pool off (1)"], ms["main 16, pool off (2)"]]
    pattern = (r"on one pinned core the step took ([\d.]+) and ([\d.]+) ms against round 9's ([\d.]+) and "
               r"([\d.]+), PyTorch SDPA ([\d.]+) .*? at 16 threads ([\d.]+), ([\d.]+) and ([\d.]+) against "
               r"round 9's ([\d.]+), ([\d.]+) and ([\d.]+), PyTorch SDPA ([\d.]+) .*? the pool off, "
               r"([\d.]+) and ([\d.]+)\.")
    sentence_agrees(pattern, figures, HISTORY)
    ratios = re.search(r"PyTorch SDPA [\d.]+ \(([\d.]+)-([\d.]+)×, issue 38", folded(HISTORY)).groups()
    one_core = [figures[0] / figures[4], figures[1] / figures[4]]
    assert agrees(ratios[0], min(one_core)) and agrees(ratios[1], max(one_core))


def test_the_round11_cpu_sentence_is_the_recorded_call():
    """Round 11's CPU engine (helpers asleep in the pool's loop) against main's tree on the H200
    host's CPU, each row alone and interleaved (benchmarks/r11-cpu16_device.sh PART=2), and the
    one-thread GEMMs side by side (PART=1), read back from the calls' records."""
    folder = RESULTS / "round11" / "cpu16"
    ms = asked(folder / "call2" / "rows.jsonl")
    conc = {(r["route"], r["threads"], r["shape"]): r["us per call"]
            for r in jsonl(folder / "call1" / "conc.jsonl") if "route" in r}
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
    sentence_agrees(pattern, figures, HISTORY)


def test_the_round11_pool_jobs_sentence_is_the_recorded_call():
    """The table's blocks as jobs of the pool (round11/cpu16b.md: the lead's host call, each row
    alone and interleaved) and the one-core rows of cpu16's second call."""
    jobs = asked(RESULTS / "round11" / "cpu16b" / "logs" / "rows.jsonl")
    on = jobs["smallem cpu, 16 threads, unpinned, r11-cpu16b SMALLEM_POOL_JOBS=1"]
    torch16 = jobs["PyTorch eager, SDPA, 16 threads, unpinned, r11-cpu16b"][0]
    one = asked(RESULTS / "round11" / "cpu16" / "call2" / "rows.jsonl")
    main1 = one["smallem cpu, 1 threads, 0, base"][0]
    torch1 = one["PyTorch eager, SDPA, 1 threads, 0, r11-cpu16"][0]
    figures = [*on, *jobs["smallem cpu, 16 threads, unpinned, r11-cpu16b SMALLEM_POOL_JOBS=0"], torch16,
               min(on) / torch16, max(on) / torch16, main1, torch1, main1 / torch1]
    pattern = (r"took ([\d.]+), ([\d.]+) and ([\d.]+) ms at 16 threads with them against ([\d.]+) and "
               r"([\d.]+) without, PyTorch SDPA ([\d.]+) \(([\d.]+)-([\d.]+)×\)\. In the earlier call one "
               r"pinned core ran main at ([\d.]+) ms against PyTorch SDPA's ([\d.]+) \(([\d.]+)×")
    sentence_agrees(pattern, figures, HISTORY)


def test_the_round13_cpu_sentence_is_the_recorded_call():
    """Round 13's re-measure on the H200 host's CPU (each row alone, this tree and main's
    interleaved, two rounds: benchmarks/r11-cpu16_device.sh PART=3) and the step by op, smallem's
    and PyTorch's, read back from round13/cpu/call1."""
    folder = RESULTS / "round13" / "cpu" / "call1"
    ms = asked(folder / "rows.jsonl")
    ops = {r["asked"]: r for r in jsonl(folder / "ops.jsonl")}
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
    sentence_agrees(pattern, figures, HISTORY)



def _attention13() -> dict[tuple[str, str, int, int], dict]:
    """Round 13's attention rows: float32 at D 64, 128 from the float32 call (its 3xTF32 tiles
    adopted there), D 32 and bf16 from the last call."""
    final = json.loads((RESULTS / "round13/final/attention_h200.json").read_text())
    rows = [dict(r, dtype="fp32") for r in json.loads(
        (RESULTS / "round13/f32/lead_call/r13_f32.json").read_text())["bench"]]
    rows += [r for r in final["fp32"] if r["D"] == 32] + final["bf16"]
    return {(r["dtype"], r["impl"], r["D"], r["T"]): r for r in rows}


def test_the_round13_float32_attention_rows_are_the_recorded_bench():
    """Round 13's float32 table; the units each row names are the record's."""
    float32_table(_attention13(), "round13/f32/lead_call/r13_f32.json", "fp32 round 13: D, T", HISTORY)


def _vs(dtype: str, d: int) -> list[float]:
    recorded = _attention13()
    return [recorded[dtype, "smallem fused", d, t]["vs_sdpa"] for t in (512, 1024, 2048, 4096)
            if (dtype, "smallem fused", d, t) in recorded]


def test_the_float32_attention_prose_is_the_recorded_bench(text=HISTORY):
    """The ranges under round 13's float32 table and D 128's backward, FFMA's and the 3xTF32
    tilings', at T 4,096 (the float32 call's own timings)."""
    d128 = next(r for r in json.loads((RESULTS / "round13/f32/lead_call/r13_f32.json").read_text())["rows"]
                if (r["D"], r["T"]) == (128, 4096))
    sentence_agrees(rf"at every T \({N}-{N}×, {N}-{N}×\); D 128 is ahead to T 1,024 and {N}× and {N}× "
                    rf"beyond: its backward is still FFMA \({N} ms at T 4,096; the 3xTF32 tilings tried "
                    rf"there took {N} and {N}\)",
                    [min(_vs("fp32", 32)), max(_vs("fp32", 32)), min(_vs("fp32", 64)), max(_vs("fp32", 64)),
                     *_vs("fp32", 128)[2:], d128["ffma_bwd"], d128["bwd (8, 16, 1)"], d128["bwd (4, 16, 1)"]],
                    text)


def test_the_round13_bf16_attention_rows_are_the_recorded_bench():
    recorded = _attention13()
    rows = table("round13/final/attention_h200.json", "bf16: D, T", HISTORY)
    for dt, smallem, cudnn, flash, ratio, tflops, device in rows:
        d, t = (int(x.replace(",", "")) for x in dt.split(", "))
        get = lambda impl: recorded["bf16", impl, d, t]  # noqa: E731
        ours, default, what = get("smallem fused"), get("PyTorch SDPA default"), f"bf16 D {d} T {t}"
        timed(smallem, ours, what + " smallem")
        timed(cudnn, default, what + " cuDNN")
        timed(flash, get("PyTorch SDPA flash"), what + " flash")
        check(ratio, ours["vs_sdpa"], what=what + " ratio")
        check(tflops, ours["tflops"], default["tflops"], what=what + " TFLOP/s")
        check(device, ours["device_bytes"] / 2**20, default["device_bytes"] / 2**20, what=what + " MiB")
    assert len(rows) == 3


def test_the_round13_bf16_prose_is_the_recorded_bench():
    """The sentence under round 13's bf16 table (now in NOTES.md's history)."""
    recorded = _attention13()
    ours = [recorded["bf16", "smallem fused", 64, t] for t in (1024, 2048, 4096)]
    flash = [o["ms"] / recorded["bf16", "PyTorch SDPA flash", 64, o["T"]]["ms"] for o in ours]
    sentence_agrees(rf"At T 4,096 {N} TFLOP/s, past issue 37's 250, and {N}× cuDNN; at T 1,024 {N}× and at "
                    rf"2,048 {N}×: .*? {N}-{N}× PyTorch's FlashAttention-2",
                    [ours[2]["tflops"], ours[2]["vs_sdpa"], ours[0]["vs_sdpa"], ours[1]["vs_sdpa"],
                     min(flash), max(flash)], HISTORY)


def _bf16_round14() -> dict[tuple[str, str, int, int], dict]:
    """Round 14's bf16 rows: the bf16 engineer's call 1, on main's bf16 code then."""
    rows = json.loads((RESULTS / "round14/bf16/call1/bench.json").read_text())["after"]
    return {(r["dtype"], r["impl"], r["D"], r["T"]): r for r in rows}


def test_the_round14_bf16_attention_rows_are_the_recorded_bench():
    bf16_table(_bf16_round14(), "round14/bf16/call1/bench.json", HISTORY)


def test_the_round14_bf16_prose_is_the_recorded_bench():
    """The sentence under round 14's bf16 table; the unadopted patch's ratios from the last call's log."""
    recorded = _bf16_round14()
    ours = [recorded["bf16", "smallem fused", 64, t] for t in (1024, 2048, 4096)]
    best = [o["ms"] / fastest(recorded, 64, o["T"])["ms"] for o in ours]
    flash = [o["ms"] / recorded["bf16", "PyTorch SDPA flash", 64, o["T"]]["ms"] for o in ours]
    patch = {}
    for line in (RESULTS / "round14/final/attention.log").read_text().splitlines():
        cells = line.split()
        if "bf16" in cells and "T=" in line:
            t = int(line.split("T=")[1].split()[0])
            patch.setdefault(t, {})[line[:22].strip()] = float(cells[cells.index("bf16") + 1])
    patched = [p["smallem fused"] / min(v for k, v in p.items() if k.startswith("PyTorch"))
               for _, p in sorted(patch.items())]
    sentence_agrees(rf"that is {N}× at T 1,024, {N}× at 2,048 and {N}× at 4,096, with {N} TFLOP/s at T 4,096 "
                    rf"\(issue 37's 250 met\); {N}-{N}× PyTorch's FlashAttention-2 kernel. "
                    rf".*? at {N} / {N} / {N}× "
                    r"and failed two tests", [*best, ours[2]["tflops"], min(flash), max(flash), *patched],
                    HISTORY)


def test_the_round13_cpu_table_is_the_recorded_calls():
    """The CPU's step at 16 threads (round 13's last call) and on 2 and 1 pinned cores (round 13's
    first host call, two rounds), each row alone, against PyTorch SDPA's in the same call."""
    last = asked(RESULTS / "round13" / "final" / "cpu" / "logs" / "rows.jsonl")
    first = asked(RESULTS / "round13" / "cpu" / "call1" / "rows.jsonl")
    recorded = {"16": (last["smallem cpu, 16 threads, unpinned, main"],
                       last["PyTorch eager, SDPA, 16 threads, unpinned, main"]),
                "2 pinned cores": (first["smallem cpu, 2 threads, 0,1, r13-cpu"],
                                   first["PyTorch eager, SDPA, 2 threads, 0,1, r13-cpu"]),
                "1 pinned core": (first["smallem cpu, 1 threads, 0, r13-cpu"],
                                  first["PyTorch eager, SDPA, 1 threads, 0, r13-cpu"])}
    rows = table("round13/final/cpu/logs/rows.jsonl", "threads (Transformer", HISTORY)
    for label, smallem, torch, ratio, target in rows:
        ours, theirs = recorded[label]
        check(smallem, *ours, what=f"CPU {label} smallem")
        check(torch, *theirs, what=f"CPU {label} PyTorch")
        ratios_and_target(ratio, target, ours, theirs, what=f"CPU {label}")
    assert [row[0] for row in rows] == list(recorded)


def test_the_round13_cpu_by_op_sentence_is_the_recorded_call():
    """The 16-thread step by operation, smallem's and PyTorch's (round13/cpu/call1/ops.jsonl)."""
    ops = {r["asked"]: r for r in jsonl(RESULTS / "round13" / "cpu" / "call1" / "ops.jsonl")}
    mine, torch = ops["ops, 16 threads"], ops["torch-ops, 16 threads"]
    sentence_agrees(rf"the attention takes {N} ms where PyTorch's SDPA takes {N} "
                    rf"\(`benchmarks/cpu_step.py torch-ops`\), the Linears {N} against {N}:",
                    [mine["forward attention"] + mine["rule attention"],
                     torch["aten::_scaled_dot_product_flash_attention_for_cpu"]
                     + torch["aten::_scaled_dot_product_flash_attention_for_cpu_backward"],
                     sum(mine[k] for k in ("forward linear", "forward linear_add", "rule linear",
                                           "rule linear_add")),
                     torch["aten::mm"] + torch["aten::addmm"]], HISTORY)


def test_the_round13_attention_rows_sentence_is_the_recorded_call(text=HISTORY):
    """The attention alone with 16 and 64 queries a product (round13/cpu/call2,
    benchmarks/r13_cpu_attention.py on the host)."""
    record = RESULTS / "round13" / "cpu" / "call2" / "attention.jsonl"
    ms = {r["asked"].strip(): r["ms"] for r in jsonl(record)}
    figures = [ms["attention, 16 threads"], ms["attention, 16 threads SMALLEM_ATTENTION_ROWS=64"],
               ms["attention, 1 threads"], ms["attention, 1 threads SMALLEM_ATTENTION_ROWS=64"]]
    sentence_agrees(rf"took the attention alone from {N} to {N} ms at 16 threads, and from {N} to {N} ms "
                    r"on one core", figures, text)


def test_the_round13_step_with_64_queries_sentence_is_the_recorded_call(text=HISTORY):
    """The 16-thread step with 64 and 16 queries a product and PyTorch SDPA's (round13/final/cpu:
    the lead's last call, each row alone)."""
    ms = asked(RESULTS / "round13" / "final" / "cpu" / "logs" / "rows.jsonl")
    ours, = ms["smallem cpu, 16 threads, unpinned, main"]
    sixteen, = ms["smallem cpu, 16 threads, unpinned, main SMALLEM_ATTENTION_ROWS=16"]
    torch, = ms["PyTorch eager, SDPA, 16 threads, unpinned, main"]
    sentence_agrees(rf"the step took {N} ms at 16 threads with it against {N} with 16 queries a product, "
                    rf"PyTorch SDPA {N} \({N}×", [ours, sixteen, torch, ours / torch], text)


def test_the_round14_cpu_sentence_is_the_recorded_call():
    """Round 14's last call on the host: this tree, round 13's (base) and PyTorch SDPA's, each row
    alone, at 16 threads and on one pinned core (round14/final/cpu)."""
    ms = asked(RESULTS / "round14" / "final" / "cpu" / "logs" / "rows.jsonl")
    rows = (("smallem cpu", "main"), ("smallem cpu", "base"), ("PyTorch eager, SDPA", "main"))
    (a16,), (b16,), (p16,) = (ms[f"{w}, 16 threads, unpinned, {tree}"] for w, tree in rows)
    (a1,), (b1,), (p1,) = (ms[f"{w}, 1 threads, 0, {tree}"] for w, tree in rows)
    ms13 = asked(RESULTS / "round13" / "cpu" / "call1" / "rows.jsonl")["smallem cpu, 1 threads, 0, r13-cpu"]
    sentence_agrees(rf"at 16 threads the step took {N} ms against round 13's {N}, PyTorch SDPA {N} "
                    rf"\({N}×\); on one pinned core {N} against {N}, PyTorch SDPA {N} \({N}×\). "
                    rf".*? engine took {N} ms on one core, against {N} and {N} then\)",
                    [a16, b16, p16, a16 / p16, a1, b1, p1, a1 / p1, b1, *ms13], HISTORY)


def test_the_round15_cpu_table_is_the_recorded_call():
    """The CPU's step at 16 threads, 2 and 1 pinned cores (round 15's second host call, two rounds,
    each row alone), beside round 14's engine and PyTorch SDPA's in the same call."""
    where = {"16": "16 threads, unpinned", "2 pinned cores": "2 threads, 0,1",
             "1 pinned core": "1 threads, 0"}
    cpu_table("round15/cpu/call2/rows.jsonl", where, "r15-cpu", 2, HISTORY)


def test_the_round15_cpu_prose_is_the_recorded_calls():
    """Under the CPU table: the processes that also timed the step by operation (ALONE_OPS, call 2)
    and the Linears by operation on one core against PyTorch's mm and addmm (call 1)."""
    ms = asked(RESULTS / "round15" / "cpu" / "call2" / "rows.jsonl")
    alone = ms["smallem cpu, 1 threads, 0, r15-cpu ALONE_OPS=1"]
    torch = ms["PyTorch eager, SDPA, 1 threads, 0, r15-cpu"]
    ops = jsonl(RESULTS / "round15" / "cpu" / "call1" / "ops.jsonl")
    linears = [sum(r[f"{w} {k}"] for w in ("forward", "rule") for k in ("linear", "linear_add"))
               for r in ops if r["asked"] == "ops, 1 threads"]
    mm = [r["aten::mm"] + r["aten::addmm"] for r in ops if r["asked"] == "torch-ops, 1 threads"]
    sentence_agrees(rf"took {N} and {N} ms \({N}× and {N}× PyTorch\), where the row alone took {N} once; "
                    rf".*? they took {N}-{N} ms of smallem's step against {N}-{N} for PyTorch's mm and addmm",
                    [*alone, *(a / b for a, b in zip(alone, torch)),
                     ms["smallem cpu, 1 threads, 0, r15-cpu"][0], min(linears), max(linears), min(mm),
                     max(mm)], HISTORY)


def test_the_round10_mlp_cpu_table_is_the_recorded_bench():
    """Round 10's MLP rows on the host's CPU (`smallem bench --model mlp`, each row alone), one
    bench JSON per thread count, every one shown, and smallem against the hand-written step."""
    against_hand = mlp_table("round10/cpu_kernels", HISTORY)
    sentence_agrees(rf"slower than the hand-written NumPy step there \({N}× and {N}×\)", against_hand,
                    HISTORY)


def test_the_round15_mlp_sentence_is_the_recorded_bench():
    record = json.loads((RESULTS / "round15" / "cpu" / "call3" / "mlp_16.json").read_text())
    rows = {r["name"]: r for r in record["rows"]}
    assert record["model"] == "mlp" and rows["smallem cpu"]["threads"] == 16
    sentence_agrees(rf"timed it again at 16 threads: {N} ms against PyTorch eager's {N} \({N}×;",
                    [rows["smallem cpu"]["ms"], rows["PyTorch eager"]["ms"], rows["smallem cpu"]["vs_torch"]],
                    HISTORY)

"""Reading a document's speed figures back from the records they cite (benchmarks/results/): the
helpers of tests/test_readme_speed.py (README's Speed section) and tests/test_speed_history.py
(benchmarks/NOTES.md's "History of the speed figures", where README's earlier rounds went).

A table is found after the "Source:" line naming its record; a sentence by a pattern with the
figures as groups; each figure must equal the record's to the decimals the text shows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from smallem.tools.bench_precision import SIZES

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = (ROOT / "README.md").read_text()
_NOTES = (ROOT / "benchmarks" / "NOTES.md").read_text()
HISTORY = _NOTES[_NOTES.index("## History of the speed figures"):]
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def table(source: str, header: str, text: str = README) -> list[list[str]]:
    """The rows of the first table whose header starts with `header` after the Source line naming
    `source` in `text`."""
    at = text.find("Source: `benchmarks/results/" + source)
    assert at >= 0, f"no Source line names {source}"
    lines = text[at:].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| " + header))
    rows = []
    for line in lines[start + 2:]:  # past the header and the | --- | line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    assert rows, f"the table '{header}' after {source} is empty"
    return rows


def folded(text: str) -> str:
    """`text` with its whitespace folded: a sentence reads the same across line breaks."""
    return " ".join(text.split())


def sentence_agrees(pattern: str, figures: list[float], text: str = README) -> None:
    """The sentence of `text` matching `pattern` (whitespace folded) quotes `figures`, in order, to
    the decimals it shows."""
    found = re.search(pattern, folded(text))
    assert found, f"no sentence matches {pattern[:60]!r}"
    written = found.groups()
    assert len(written) == len(figures) and all(agrees(w, v) for w, v in zip(written, figures)), \
        f"the text says {written}, the record {figures}"


def numbers(cell: str) -> list[str]:
    return NUMBER.findall(cell.replace("**", ""))


def agrees(written: str, value: float) -> bool:
    """`written` is `value` to the decimals it shows."""
    decimals = len(written.split(".")[1]) if "." in written else 0
    return abs(float(written.replace(",", "")) - value) <= 0.5 * 10 ** -decimals + 1e-9


def check(cell: str, *values: float | None, what: str) -> None:
    """`cell` shows `values` in order ("-" where the record has none)."""
    if values[0] is None:
        assert cell == "-", f"{what}: the text shows {cell!r} where the record has no figure"
        return
    written = numbers(cell)
    assert len(written) >= len(values), f"{what}: {cell!r} should show {values}"
    for w, v in zip(written, values):
        assert agrees(w, v), f"{what}: the text says {w}, the record {v:.4g}"


def timed(cell: str, row: dict | None, what: str) -> None:
    """A time, '(eager)' exactly where the record timed it without a graph."""
    check(cell, row and row["ms"], what=what)
    if row is not None:
        assert ("(eager)" in cell) == row["timing"].startswith("eager"), f"{what}: graph or eager?"


def size(label: str) -> tuple[str, str]:
    """('mlp' | 'transformer', the bench's size name) from a table's model label."""
    if label.startswith("byte MLP"):
        return "mlp", "default"
    layers, width, context = map(int, re.match(r"Transformer (\d+) × (\d+), T (\d+)", label).groups())
    names = [n for n, c in SIZES.items() if (c.layers, c.width, c.context) == (layers, width, context)]
    assert names, f"no bench size is {label}"
    return "transformer", names[0]


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def asked(path: Path) -> dict[str, list[float]]:
    """A host call's rows: each asked row's times (a row asked in two rounds has two)."""
    ms: dict[str, list[float]] = {}
    for r in jsonl(path):
        ms.setdefault(r["asked"].strip(), []).append(r["ms"])
    return ms


def cited(text: str) -> list[str]:
    """The records under benchmarks/results/ that `text` cites as `roundN/...`, a `{a,b}` in a
    name standing for each of its names."""
    found = set()
    for name in re.findall(r"`(?:benchmarks/results/)?(round\d+/[^`\s]+)`", text):
        braces = re.search(r"\{([^}]*)\}", name)
        parts = braces[1].split(",") if braces else [""]
        found.update(name[:braces.start()] + part + name[braces.end():] if braces else name for part in parts)
    return sorted(found)


def float32_table(recorded: dict, source: str, header: str, text: str,
                  pytorch_units: str | None = None) -> None:
    """A float32 attention table (D, T | smallem | units | PyTorch SDPA | ratio | TFLOP/s | MiB) read
    back row by row from `recorded` ((dtype, impl, D, T) -> row), every smallem row of it shown."""
    rows = table(source, header, text)
    for dt, flash, units, sdpa, ratio, tflops, device in rows:
        d, t = (int(x.replace(",", "")) for x in dt.split(", "))
        mine, theirs = recorded["fp32", "smallem fused", d, t], recorded["fp32", "PyTorch SDPA default", d, t]
        what = f"{header} D {d} T {t}"
        assert units == mine["units"], what + " units"
        if pytorch_units is not None:
            assert theirs["units"] == pytorch_units, what + " PyTorch's units"
        timed(flash, mine, what + " flash")
        timed(sdpa, theirs, what + " SDPA")
        check(ratio, mine["vs_sdpa"], what=what + " ratio")
        check(tflops, mine["tflops"], theirs["tflops"], what=what + " TFLOP/s")
        check(device, mine["device_bytes"] / 2**20, theirs["device_bytes"] / 2**20, what=what + " device MiB")
    assert len(rows) == len({k for k in recorded if k[:2] == ("fp32", "smallem fused")}) == 12


def step_table(source: str, text: str) -> None:
    """A step table (model (batch) | precision | smallem | PyTorch | ratio | TFLOP/s (of peak)) read
    back row by row from the `smallem bench --precision --sizes` record `source`, every row shown."""
    recorded = {(r["model"], r["size"], r["precision"]): r
                for r in json.loads((RESULTS / source).read_text())["rows"]}
    shown = set()
    for label, precision, smallem, torch, ratio, tflops in table(source, "model (batch)", text):
        key = (*size(label), precision)
        assert key in recorded, f"the row {key} is not in the recorded runs"
        row, what = recorded[key], " ".join(key)
        check(smallem, row["smallem_ms"], what=what + " smallem ms")
        check(torch, row["torch_ms"], what=what + " PyTorch ms")
        check(ratio, row["ratio"], what=what + " ratio")
        check(tflops, row["tflops"], 100 * row["peak_share"], what=what + " TFLOP/s")
        shown.add(key)
    assert shown == set(recorded), f"recorded but not shown: {sorted(set(recorded) - shown)}"


def fastest(recorded: dict, d: int, t: int) -> dict:
    """PyTorch's fastest bf16 SDPA row (its default, cuDNN named or flash) at D d, T t."""
    return min((recorded["bf16", f"PyTorch SDPA {k}", d, t] for k in ("default", "cudnn", "flash")),
               key=lambda r: r["ms"])


def bf16_table(recorded: dict, source: str, text: str) -> None:
    """A bf16 attention table (D, T | smallem | default | cuDNN | flash | vs the fastest | TFLOP/s |
    MiB) read back row by row from `recorded` ((dtype, impl, D, T) -> row), its three T shown."""
    rows = table(source, "bf16: D, T", text)
    for dt, smallem, default, cudnn, flash, ratio, tflops, device in rows:
        d, t = (int(x.replace(",", "")) for x in dt.split(", "))
        get = lambda impl: recorded["bf16", impl, d, t]  # noqa: E731
        ours, what = get("smallem fused"), f"bf16 D {d} T {t}"
        timed(smallem, ours, what + " smallem")
        timed(default, get("PyTorch SDPA default"), what + " default")
        timed(cudnn, get("PyTorch SDPA cudnn"), what + " cuDNN")
        timed(flash, get("PyTorch SDPA flash"), what + " flash")
        best = fastest(recorded, d, t)
        check(ratio, ours["ms"] / best["ms"], what=what + " ratio")
        check(tflops, ours["tflops"], best["tflops"], what=what + " TFLOP/s")
        check(device, ours["device_bytes"] / 2**20, get("PyTorch SDPA default")["device_bytes"] / 2**20,
              what=what + " MiB")
    assert len(rows) == 3


def ratios_and_target(ratio: str, target: str, ours: list[float], theirs: list[float], what: str) -> None:
    """A CPU table row's ratio cell (ours ÷ theirs, round by round) and its target cell ("≤ B×:
    met", "met in one round of two", "met in two rounds of three" or "not met", as the ratios say)."""
    ratios = [a / b for a, b in zip(ours, theirs)]
    check(ratio, *ratios, what=what + " ratio")
    bound = float(target.split("≤ ")[1].split("×")[0])
    met, rounds = sum(r <= bound for r in ratios), len(ratios)
    words = {1: "one", 2: "two", 3: "three"}
    said = ("met" if met == rounds else "not met" if met == 0
            else f"met in {words[met]} round{'s' if met > 1 else ''} of {words[rounds]}")
    assert target.endswith(": " + said), (what, target, said)


def mlp_table(folder: str, text: str = README) -> list[float]:
    """An MLP table (`smallem bench --model mlp`, one bench JSON a thread count in `folder`: 16 and
    2 pinned cores) read back cell by cell, both rows shown; smallem ÷ the hand-written step, by row."""
    files = {"16": "mlp_16.json", "2 pinned cores": "mlp_2.json"}
    shown, against_hand = set(), []
    for label, smallem, hand, torch, ratio in table(folder + "/mlp_{16,2}.json", "threads (MLP", text):
        record = json.loads((RESULTS / folder / files[label]).read_text())
        rows = {r["name"]: r for r in record["rows"]}
        assert record["model"] == "mlp" and rows["smallem cpu"]["threads"] == int(label.split()[0])
        check(smallem, rows["smallem cpu"]["ms"], what=f"MLP {label} smallem")
        check(hand, rows["hand-written NumPy"]["ms"], what=f"MLP {label} hand-written")
        check(torch, rows["PyTorch eager"]["ms"], what=f"MLP {label} PyTorch")
        check(ratio, rows["smallem cpu"]["vs_torch"], what=f"MLP {label} ratio")
        against_hand.append(rows["smallem cpu"]["ms"] / rows["hand-written NumPy"]["ms"])
        shown.add(files[label])
    assert shown == set(files.values())
    return against_hand


def cpu_table(source: str, where: dict[str, str], tree: str, rounds: int, text: str = README) -> None:
    """A CPU step table (threads | smallem | the engine before | PyTorch SDPA | ratio | target) read
    back from `source`'s rows (r11-cpu16_device.sh PART=3: this tree named `tree`, the one before
    named base), `rounds` rounds a cell; `where` maps each row's label to its rows' "N threads, pins"."""
    ms = asked(RESULTS / source)
    rows = table(source, "threads (Transformer", text)
    for label, smallem, before, torch, ratio, target in rows:
        ours, base = ms[f"smallem cpu, {where[label]}, {tree}"], ms[f"smallem cpu, {where[label]}, base"]
        theirs = ms[f"PyTorch eager, SDPA, {where[label]}, {tree}"]
        assert len(ours) == len(base) == len(theirs) == rounds, label
        check(smallem, *ours, what=f"CPU {label} smallem")
        check(before, *base, what=f"CPU {label} the engine before")
        check(torch, *theirs, what=f"CPU {label} PyTorch")
        ratios_and_target(ratio, target, ours, theirs, what=f"CPU {label}")
    assert [row[0] for row in rows] == list(where)


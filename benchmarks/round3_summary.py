"""The short table at the end of benchmarks/gpu_round3.sh, read from the files it wrote:
`python benchmarks/round3_summary.py DIR`. A missing file prints as '-' (its stage failed)."""

import json
import re
import sys
from pathlib import Path

out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")


def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None


def row(bench, name):
    return next((r for r in (bench or {}).get("rows", []) if r["name"] == name
                 and r["device"] == "gpu"), None)


lines = []
log = (out / "pytest.log").read_text() if (out / "pytest.log").exists() else ""
tail = re.findall(r"^=*\s*(\d+ (?:passed|failed).*?)\s*=*$", log, re.M)
lines.append(("GPU tests", tail[-1] if tail else "-"))
t = load("bench_transformer.json")
cap = row(t, "smallem gpu, captured")
for name in ("smallem gpu", "smallem gpu, captured", "PyTorch eager", "PyTorch eager, SDPA",
             "PyTorch CUDA graph", "PyTorch CUDA graph, SDPA"):
    r = row(t, name)
    lines.append((f"transformer {name}", f"{r['ms']:.3f} ms" if r else "-"))
if cap and cap.get("vs_torch_graph"):
    lines.append(("captured / PyTorch graph (target <= 1.0)", f"{cap['vs_torch_graph']:.2f}x"))
if cap and cap.get("vs_sdpa_graph"):
    lines.append(("captured / PyTorch graph SDPA (stretch <= 0.8)", f"{cap['vs_sdpa_graph']:.2f}x"))
cpu = [r for r in (t or {}).get("rows", []) if r["device"] == "cpu"]
for r in cpu:
    lines.append((f"transformer {r['name']} (cpu, small)", f"{r['ms']:.2f} ms"
                  + (f" ({r['vs_torch']:.2f}x torch)" if r.get("vs_torch") else "")))
m = row(load("bench_mlp.json"), "smallem gpu, captured")
lines.append(("MLP captured / PyTorch graph (<= 0.5)",
              f"{m['ms']:.3f} ms, {m['vs_torch_graph']:.2f}x" if m and m.get("vs_torch_graph")
              else "-"))
c = load("capture_transformer.json")
lines.append(("2,000 steps captured vs plain", "-" if not c else
              f"max |diff| {c['max_abs_difference']:.2e} (plain vs plain "
              f"{c['plain_vs_plain_max_abs_difference']:.2e}); "
              f"{c['plain_ms_per_step']:.2f} vs {c['captured_ms_per_step']:.3f} ms/step"))
k = load("calls_transformer.json")
if k:
    lines.append(("backend calls per step", f"unfused {k['unfused_calls']}, fused "
                  f"{k['fused_calls']}, captured: 1 graph launch + 1 copy"))
r = load("train_transformer.json")
lines.append(("10,000-step run (target < 20 s, held-out <= 1.20)", "-" if not r else
              f"{r['wall_seconds']:.1f} s loop, held-out {r['held_out_loss']:.4f} "
              f"(steps {r['steps']})"))
width = max(len(a) for a, _ in lines)
print("\n".join(f"{a:<{width}}  {b}" for a, b in lines))

"""The Transformer's device results as the package data notebook 10's Transformer section shows
where no GPU is: `python benchmarks/record_transformer.py DIR` reads the files that
`bash benchmarks/gpu_session.sh transformer` wrote in DIR (bench_transformer.json,
calls_transformer.json, capture_transformer.json, train_transformer.json, bench_mlp.json) and
writes smallem/course/l10_the_captured_step/recorded/transformer_gpu_bench.json.
Commit DIR under benchmarks/results/."""

import json
import sys
from pathlib import Path

src = Path(sys.argv[1])
dest = (Path(__file__).resolve().parents[1]
        / "smallem/course/l10_the_captured_step/recorded/transformer_gpu_bench.json")


def load(name):
    path = src / name
    return json.loads(path.read_text()) if path.exists() else None


bench = load("bench_transformer.json")
calls = load("calls_transformer.json") or {}
capture = load("capture_transformer.json") or {}
train = load("train_transformer.json") or {}
mlp = load("bench_mlp.json") or {}
out = {
    "source": f"benchmarks/results/{src.name}/, written by benchmarks/gpu_session.sh",
    "machine": bench["machine"],
    "config": bench["config"],
    "batch": bench["batch"],
    "rows": [{k: r[k] for k in ("name", "device", "ms", "p10", "p90", "loss", "vs_torch",
                                "vs_torch_graph", "vs_sdpa_graph")} for r in bench["rows"]],
    "calls": {k: v for k, v in calls.items() if not k.endswith("_by_call")},
    "capture": {k: v for k, v in capture.items() if not k.endswith("_losses")},
    "train": {k: train.get(k) for k in ("steps", "wall_seconds", "held_out_loss",
                                        "steps_per_second", "parameters")} if train else None,
    "mlp_captured_vs_graph": next((r["vs_torch_graph"] for r in mlp.get("rows", [])
                                   if r["name"] == "smallem gpu, captured"), None),
}
dest.write_text(json.dumps(out, indent=1) + "\n")
print(f"wrote {dest}")

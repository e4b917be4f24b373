"""Lesson 15's recorded attention rows, made from a round's recorded bench JSONs: `python
benchmarks/l15_record.py` (round 15's: the bf16 rows of round 15's last call on the merged main,
the float32 rows of round 14's last call, whose float32 kernels round 15 left as they were, both
at D 64; rounds 13 and 14's records were made the same way) -> benchmarks/results/round15/attention_h200.json,
kept there, and its copy smallem/course/l15_memory/recorded/attention_h200.json (the package's
copies equal a kept record: tests/test_portability.py)."""

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
KEPT = RESULTS / "round15/attention_h200.json"
OUT = Path(__file__).resolve().parents[1] / "smallem/course/l15_memory/recorded/attention_h200.json"
BF16 = "round15/final/attention_h200.json"
FP32 = "round14/final/attention_h200.json"

if __name__ == "__main__":
    bf16 = json.loads((RESULTS / BF16).read_text())
    fp32 = json.loads((RESULTS / FP32).read_text())["fp32"]
    rows = [r for r in fp32 + bf16["bf16"] if r["D"] == 64]
    record = {"device": "gpu", "machine": bf16["machine"],
              "what": "smallem bench --attention rows, forward + backward, causal, 8 heads of D 64, "
                      "B*T = 32768, captured, median of 20 graph replays, on the same H200 model: "
                      "round 14's float32 (an FFMA forward, a 3xTF32 backward on the tensor "
                      f"cores, benchmarks/results/{FP32}) and round 15's bf16 (the wgmma forward "
                      "and key kernel, compiled by NVRTC as a user's run compiles them, "
                      f"benchmarks/results/{BF16}). "
                      "PyTorch: SDPA's default choice (memory-efficient 3xTF32 in float32, cuDNN in "
                      "bf16) and its flash and cuDNN kernels in bf16.",
              "attention": rows}
    for path in (KEPT, OUT):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
        tmp.replace(path)
        print(f"{path}: {len(rows)} rows")

"""Lesson 16's recorded GPU run: benchmarks/results/round4/tokens_{bytes,bpe}.json and the
samples log (from benchmarks/tokens_gpu.sh) summed up as smallem/course/l16_tokens/recorded/tokens_gpu.json
and its copy benchmarks/results/round4/tokens_gpu.json (tests/test_portability.py keeps them equal).
`python benchmarks/record_tokens.py`
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "round4"


def run_summary(data: dict) -> dict:
    score = data["bits_per_byte"]
    return {"vocab": data["config"]["sizes"]["vocab"], "steps": data["steps"],
            "seconds": data["steps"] / data["steps_per_second"],  # the training loop, no evaluations
            "parameters": data["parameters"], "bits_per_byte": score["bits_per_byte"],
            "nats_per_target": score["nats_per_target"], "targets": score["targets"],
            "bytes": score["bytes"], "held_out_loss": data["held_out_loss"]}


def samples(log: str) -> dict:
    out, name = {}, None
    for line in log.splitlines(keepends=True):
        if line.startswith("=== sample "):
            name = line.split()[-1]
            out[name] = ""
        elif name is not None:
            out[name] += line
    prompt = "    def __init__(self"
    return {k: v.removeprefix(prompt).rstrip("\n") for k, v in out.items()}


def main() -> None:
    runs = {name: run_summary(json.loads((RESULTS / f"tokens_{file}.json").read_text()))
            for name, file in (("bytes", "bytes"), ("tokens", "bpe"))}
    corpus = json.loads((RESULTS / "tokens_bytes.json").read_text())["corpus"]
    record = {"device": "NVIDIA H200",
              "source": "benchmarks/tokens_gpu.sh: smallem train --model transformer --backend gpu "
                        "(the default byte run) and --tokens bpe --vocab 2048 --steps N, N from a "
                        "1,000-step token run's rate times the byte run's loop time",
              "corpus_note": f"default corpus {corpus['source']} ({corpus['documents']} documents); "
                             "scored on the first 32,768 held-out bytes",
              "runs": runs, "samples": samples((RESULTS / "tokens_samples.log").read_text())}
    text = json.dumps(record, indent=1) + "\n"
    for path in (RESULTS / "tokens_gpu.json", ROOT / "smallem/course/l16_tokens/recorded/tokens_gpu.json"):
        path.write_text(text)


if __name__ == "__main__":
    main()

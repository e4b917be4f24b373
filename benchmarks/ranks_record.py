"""Lesson 17's runs on the device host (issue 39): CPU ranks on its cores (2 and 4 ranks follow one
process for 100 steps to float64 rounding; the step split into compute and all-reduce, plain order
against overlap, `smallem bench --ranks N`), beside the GPU test of one NCCL rank in the captured
step (tests/test_ranks_gpu.py, run by the caller). Writes JSON and prints a log.
    python benchmarks/ranks_record.py OUT_DIR"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from smallem import ranks
from smallem.training.config import TrainConfig

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
import ranked_runs  # noqa: E402 - what the ranks run, by name

from smallem.data import load_corpus  # noqa: E402
from smallem.training.loop import train  # noqa: E402


def relative(a: dict, b: dict) -> float:
    return max(float(np.abs(a[k] - b[k]).max() / np.abs(b[k]).max()) for k in b)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1] / "tests"),
                                                os.environ.get("PYTHONPATH", "")])
    # The device host's mpiexec is Open MPI's, run as root there: it refuses unless told (its
    # own message names these two variables). A lent machine, not a user's: told here only.
    for name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        os.environ.setdefault(name, "1")
    record: dict = {"cores": ranks.launch.cores()}
    began = time.perf_counter()
    one = ranked_runs.outcome(train(ranked_runs.tiny(), corpus=load_corpus(
        max_bytes=ranked_runs.CORPUS_BYTES), progress=False, log=None))
    many = ranks.run(4, "ranked_runs:trajectories", [2, 4], {})[0]
    record["trajectory"] = {str(n): {"max_relative_parameter_difference":
                                     relative(many[n]["parameters"], one["parameters"]),
                                     "final_loss": many[n]["losses"][-1]} for n in many}
    record["trajectory"]["1"] = {"final_loss": one["losses"][-1]}
    print("100 steps, cpu64, batch 7:", json.dumps(record["trajectory"]), flush=True)
    record["bench"] = {}
    for model, batch, counts, steps in (("mlp", None, (2, 4), 8), ("transformer", 32, (4,), 4)):
        config = TrainConfig(model=model, backend="cpu", batch=batch)
        single = ranks.bench(1, config, steps=steps, warmup=1)
        for n in counts:
            rows = ranks.bench(n, config, steps=steps, warmup=1)
            record["bench"][f"{model}/{n}"] = {"one_process": single, "rows": rows}
            print(f"{model} batch {config.batch}: one process {single[0]['step_ms']:.1f} ms",
                  flush=True)
            from smallem.tools.bench_ranks import table

            print(table(rows, single[0]["step_ms"]), flush=True)
    record["seconds"] = time.perf_counter() - began
    (out / "ranks_cpu.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))

"""Why did `smallem train --model transformer --precision fp16` run at 955 steps/s against bf16's
1,817 in round 8's first call (heldout_*.json), when the captured fp16 step times as bf16's?
This trains the default Transformer as `smallem train` does, for a few thousand steps, and says
where the wall time went: the plain steps (how many, and their time), the capture, the replays,
the log points; and the scaler's skips (a skipped step is still a replay: the device decides).

    python benchmarks/fp16_run_diag.py PRECISION [STEPS] [OUT.json]
"""

from __future__ import annotations

import json
import os
import sys
import time

from smallem.backends.precision import LossScaler
from smallem.training import step as step_module
from smallem.training.config import TrainConfig
from smallem.training.loop import train


def main() -> None:
    precision = sys.argv[1] if len(sys.argv) > 1 else "fp16"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    out = sys.argv[3] if len(sys.argv) > 3 else None
    seen: dict = {"plain": 0, "plain_s": 0.0, "capture_s": 0.0, "replay": 0, "replay_s": 0.0,
                  "first_plain_s": []}
    original = step_module.CapturedStep.__call__

    def timed(self, contexts, targets, observer=None):  # the wall time of each path, no sync
        was_graph = self.graph is not None
        began = time.perf_counter()
        plain = not self.capturable(contexts, targets, observer)
        loss = original(self, contexts, targets, observer)
        spent = time.perf_counter() - began
        if plain:
            seen["plain"] += 1
            seen["plain_s"] += spent
            if len(seen["first_plain_s"]) < 8:
                seen["first_plain_s"].append(round(spent, 4))
        elif not was_graph:
            seen["capture_s"] += spent
        else:
            seen["replay"] += 1
            seen["replay_s"] += spent
        return loss

    step_module.CapturedStep.__call__ = timed
    compiles: list = []
    from functools import cache

    from smallem.backends.cuda import common

    @cache
    def compiled(source: str):  # common.compiled, compiling now and timing it (kernel() calls it)
        began = time.perf_counter()
        module = common.cupy.RawModule(code=source)
        module.compile()
        names = [line.split("void", 1)[1].split("(")[0].strip() for line in source.splitlines()
                 if "__global__ void" in line][:2]
        compiles.append((names, round(time.perf_counter() - began, 3)))
        return module

    common.compiled = compiled
    scaler = LossScaler() if precision == "fp16" else None
    config = TrainConfig(model="transformer", backend=os.environ.get("BACKEND", "gpu"),
                         precision=precision, steps=steps, log_every=250, eval_every=10 ** 9)
    began = time.perf_counter()
    result = train(config, progress=False, loss_scaler=scaler if scaler is not None else "auto")
    wall = time.perf_counter() - began
    if scaler is not None and scaler.settle is not None:
        scaler.settle()  # the device's skips and scale back on the host
    record = {"precision": precision, "steps": steps, "wall_s": round(wall, 3),
              "steps_per_second": getattr(result, "steps_per_second", None),
              **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in seen.items()},
              "compiles": len(compiles), "compile_s": round(sum(c[1] for c in compiles), 3),
              "slowest_compiles": sorted(compiles, key=lambda c: -c[1])[:6],
              "scaler": None if scaler is None else {"scale": scaler.scale, "skipped": scaler.skipped}}
    print(json.dumps(record))
    if out:
        with open(out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()

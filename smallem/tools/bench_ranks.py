"""`smallem bench --ranks N`: the data-parallel step on N CPU ranks, its median time split into
compute and the wait for the all-reduce, in the plain order (every bucket summed after backward)
and with overlap (a bucket summed while backward computes the ones below), beside the all-reduce
of the same buffer alone, and one process on the same global batch.
"""

from __future__ import annotations

from typing import Any

from ..errors import SmallemError


def table(rows: list[dict[str, Any]], one: float | None) -> str:
    head = (f"{'ranks':>5}  {'order':<8} {'step ms':>9} {'compute':>9} {'all-reduce wait':>16} "
            f"{'all-reduce alone':>17} {'buckets':>7}  {'vs 1 process':>12}")
    lines = [head]
    for r in rows:
        ratio = f"{one / r['step_ms']:.2f}x" if one else ""
        lines.append(f"{r['ranks']:>5}  {'overlap' if r['overlap'] else 'plain':<8} "
                     f"{r['step_ms']:>9.2f} {r['compute_ms']:>9.2f} {r['allreduce_wait_ms']:>16.2f} "
                     f"{r['allreduce_alone_ms']:>17.2f} {r['buckets']:>7}  {ratio:>12}")
    return "\n".join(lines)


def main(n: int, model: str, batch: int | None, steps: int, warmup: int,
         json_path: str | None) -> int:
    from .. import ranks
    from ..training.config import TrainConfig

    if n < 1:
        raise SmallemError(f"--ranks must be a whole number of at least 1, got {n}")
    config = TrainConfig(model=model, backend="cpu", batch=batch)
    one = ranks.bench(1, config, steps=steps, warmup=warmup)  # the same step, one process
    rows = ranks.bench(n, config, steps=steps, warmup=warmup) if n > 1 else one
    single = one[0]["step_ms"]
    print(f"{model}, batch {config.batch} (global), cpu (float32), {rows[0]['gradient_bytes']:,} "
          f"gradient bytes; median of {steps} steps on rank 0; one process: {single:.2f} ms")
    print(table(rows, single))
    if json_path:
        from ..files import write_json

        write_json(json_path, {"one_process_ms": single, "rows": rows})
        print(f"written to {json_path}")
    return 0

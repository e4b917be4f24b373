"""What watching costs: the CPU training loop with and without a HealthMonitor sampling every
N steps (issue 15: at most 10 % at N = 100).

Two measures, because a shared machine is noisy. (1) The monitor's own time: it times its
hooks (`HealthMonitor.seconds`), which is its whole cost, as a fraction of the watched run's
training time. (2) Wall clock: watched and unwatched runs of `train` alternate, and the median
steps/s of each are compared. Not a pass/fail test: timings belong here, not in tests/.

    python benchmarks/health_cost.py [--steps 1000] [--every 100] [--pairs 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics

from smallem.data import load_corpus
from smallem.training.config import TrainConfig, build_model
from smallem.training.health import HealthMonitor
from smallem.training.loop import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    corpus = load_corpus()
    config = TrainConfig(backend=args.backend, steps=args.steps, log_every=args.every,
                         eval_every=args.steps, eval_batches=2, save_every=0)
    plain, watched, shares = [], [], []
    for pair in range(args.pairs):
        for watch in (False, True):  # alternate, so slow phases of the machine hit both
            monitor = HealthMonitor(args.every, build_model(config, "cpu64")) if watch else None
            result = train(config, corpus=corpus, progress=False, log=None, observer=monitor)
            (watched if watch else plain).append(result.steps_per_second)
            if watch:
                training_seconds = result.steps / result.steps_per_second
                shares.append(monitor.seconds / training_seconds)
                print(f"pair {pair + 1}: plain {plain[-1]:.1f} steps/s, watched "
                      f"{watched[-1]:.1f} steps/s; the monitor's hooks took {monitor.seconds:.3f} s "
                      f"of {training_seconds:.1f} s ({shares[-1]:.2%}), {len(monitor.records)} samples")
    slowdown = 1 - statistics.median(watched) / statistics.median(plain)
    report = {"backend": config.backend, "steps": args.steps, "every": args.every,
              "pairs": args.pairs, "plain_steps_per_second": plain,
              "watched_steps_per_second": watched, "monitor_share": shares,
              "median_monitor_share": statistics.median(shares),
              "median_wall_clock_slowdown": slowdown}
    print(f"monitor's own time: median {report['median_monitor_share']:.2%} of training time; "
          f"wall clock: median {slowdown:+.1%} (negative: the watched runs were faster, noise)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

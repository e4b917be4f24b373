#!/usr/bin/env bash
# `smallem bench` of the code before this round's redesign (a copy in .old/, made with
# `git archive COMMIT smallem | tar -x -C .old`: 101eea9 for round 2, 8c5e267 for round 3) and
# of the working tree, one after the other on the same machine: no step may get slower. The ratio to the hand-written
# step of the same run is what compares across the two processes.
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
STEPS=${STEPS:-300}
for tree in .old .; do
  echo "=== bench of $tree"
  (cd "$tree" && python3 -m smallem bench --steps "$STEPS" --warmup 50 --no-cpu64 --no-torch \
    2>&1) | tee "$OUT/bench_$( [ "$tree" = . ] && echo after || echo before ).log" | tail -9
done

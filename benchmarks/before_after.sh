#!/usr/bin/env bash
# `smallem bench` of an earlier commit (a copy in .old/, made with
# `mkdir .old && git archive COMMIT smallem | tar -x -C .old`) and of the working tree, one after
# the other on the same machine: a change may not make a step slower. The ratio to the
# hand-written step of the same run is what compares across the two processes.
#   OUT=DIR STEPS=300 bash benchmarks/before_after.sh   (gpu_session.sh's stage before_after)
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
STEPS=${STEPS:-300}
for tree in .old .; do
  echo "=== bench of $tree"
  (cd "$tree" && python3 -m smallem bench --steps "$STEPS" --warmup 50 --no-cpu64 --no-torch \
    2>&1) | tee "$OUT/bench_$( [ "$tree" = . ] && echo after || echo before ).log" | tail -9
done

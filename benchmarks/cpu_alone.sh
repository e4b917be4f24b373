#!/usr/bin/env bash
# The small Transformer's CPU step, each row alone in its own process (no other library's
# threads beside it), at 16 threads and on 2 pinned cores, two rounds in turn (issue 31's target).
#   OUT=folder bash benchmarks/cpu_alone.sh      -> $OUT/cpu_alone.jsonl
set -uo pipefail
OUT=${OUT:-/tmp/cpu_alone}; mkdir -p "$OUT"
export PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES=
for threads in 16 2; do
  pin=""; [ "$threads" = 2 ] && pin="taskset -c 0,1"
  for round in 1 2; do
    for row in "smallem cpu" "PyTorch eager" "PyTorch eager, SDPA"; do
      OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads timeout 45 $pin \
        python3 benchmarks/cpu_step.py alone "$row" 30 >> "$OUT/cpu_alone.jsonl" 2>> "$OUT/cpu_alone.err"
    done
  done
done
cat "$OUT/cpu_alone.jsonl"; tail -3 "$OUT/cpu_alone.err"

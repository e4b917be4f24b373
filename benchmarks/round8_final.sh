#!/usr/bin/env bash
# Round 8's last device call, on the merged main: every GPU test, the step in each precision at
# every size (README's tables, issue 36's grid), the bf16 step's kernels, and how far a change of
# seed moves the held-out loss in fp32 (is TF32's +0.018 in call 1 more than that?).
#   OUT=DIR bash benchmarks/round8_final.sh [STAGE ...]   (default: tests precision profile seeds)
#   -> DIR/round8_final.tar.gz (every log and JSON)
set -uo pipefail
OUT=${OUT:-/tmp/r8f}; W=$OUT/w; mkdir -p "$W"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
for stage in ${*:-tests precision profile seeds}; do
  case $stage in
    tests) OUT=$W timeout 200 bash benchmarks/gpu_session.sh env tests 2>&1 | tee "$W/tests_session.log" ;;
    precision) OUT=$W timeout 330 bash benchmarks/gpu_session.sh precision 2>&1 | tail -25 ;;
    profile) OUT=$W timeout 90 bash benchmarks/gpu_session.sh profile_bf16 2>&1 | grep "GPU time" ;;
    seeds)
      for seed in 1 2; do
        PYTHONPATH=$PWD timeout 40 $PY -m smallem train --model transformer --backend gpu --precision fp32 \
          --seed $seed --log-every 5000 --json "$W/heldout_fp32_seed$seed.json" 2>&1 | grep -a "^held-out"
      done ;;
  esac
done
tar -C "$W" -czf "$OUT/round8_final.tar.gz" .

#!/usr/bin/env bash
# Round 9's last device call, on the merged main: every GPU test (NVRTC compiles, as a user's run
# does), gradcheck in bf16 and fp16, the step in each precision at every size (README's tables,
# issue 36's grid), the bf16 attention rows with the merged defaults (README, issue 37), then what
# decides next round's switches: the 2-D tiled key kernel's tests on the copies path and the bf16
# step with it (TILED=1), and TF32's held-out loss over two more seeds (round 8: +0.018 on one).
#   OUT=DIR bash benchmarks/round9_final.sh [STAGE ...]
#   (stages, in order of need: tests gradcheck_low precision attn_bf16 tiled seeds)
#   -> DIR/round9_final.tar.gz, rewritten after every stage (a call cut short keeps what ran)
set -uo pipefail
OUT=${OUT:-/tmp/r9f}; W=$OUT/w; mkdir -p "$W"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
for stage in ${*:-tests gradcheck_low precision attn_bf16 tiled seeds}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests) OUT=$W timeout ${TESTS_S:-200} bash benchmarks/gpu_session.sh env tests 2>&1 | tee "$W/tests_session.log" | tail -12 ;;
    gradcheck_low) OUT=$W bash benchmarks/gpu_session.sh gradcheck_low 2>&1 | tail -6 ;;
    precision) OUT=$W timeout ${PRECISION_S:-150} bash benchmarks/gpu_session.sh precision 2>&1 | tail -22 ;;
    attn_bf16) OUT=$W timeout 90 bash benchmarks/attention_round9.sh bench64 bench128 2>&1 | grep -v "^=== done" ;;
    tiled)
      OUT=$W/tiled TILED=1 CALL=tiled TESTS_S=60 timeout 70 bash benchmarks/attention_round9.sh tests 2>&1 | tail -8
      OUT=$W/tiled TILED=1 STEP_S=80 timeout 90 bash benchmarks/attention_round9.sh step 2>&1 | tail -8 ;;
    seeds)
      for seed in 1 2; do
        PYTHONPATH=$PWD timeout 40 $PY -m smallem train --model transformer --backend gpu --precision tf32 \
          --seed $seed --log-every 5000 --json "$W/heldout_tf32_seed$seed.json" 2>&1 | grep -a "^held-out"
      done ;;
  esac
  tar -C "$W" -czf "$OUT/round9_final.tar.gz" .
done
echo "=== done ($(date +%T))"

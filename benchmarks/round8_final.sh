#!/usr/bin/env bash
# Round 8's last device call, on the merged main: every GPU test, the step in each precision at
# every size (README's tables, issue 36's grid), attention's rows with the merged defaults (bf16
# at D 64 and 128; float32 at T 4,096 and D 128's T 2,048, which round 8's float32 call did not
# reach), and how far a change of seed moves fp32's held-out loss (TF32 moved +0.018 in call 1).
#   OUT=DIR bash benchmarks/round8_final.sh [STAGE ...]
#   (stages, in order of need: tests precision attn_bf16 attn_f32 seeds profile)
#   -> DIR/round8_final.tar.gz, rewritten after every stage (a call cut short keeps what ran)
set -uo pipefail
OUT=${OUT:-/tmp/r8f}; W=$OUT/w; mkdir -p "$W"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
for stage in ${*:-tests precision attn_bf16 attn_f32 seeds}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests) OUT=$W timeout 170 bash benchmarks/gpu_session.sh env tests 2>&1 | tee "$W/tests_session.log" | tail -12 ;;
    precision) OUT=$W timeout 120 bash benchmarks/gpu_session.sh precision 2>&1 | tail -22 ;;
    attn_bf16) OUT=$W timeout 90 bash benchmarks/attention_round8.sh bench64 bench128 2>&1 | grep -v "^=== done" ;;
    attn_f32)
      OUT=$W TRIES=0 LENGTHS="2048 4096" VARIANTS_S=90 bash benchmarks/attention_round8_f32.sh variants 2>&1 | tail -30 ;;
    seeds)
      for seed in 1 2; do
        PYTHONPATH=$PWD timeout 40 $PY -m smallem train --model transformer --backend gpu --precision fp32 \
          --seed $seed --log-every 5000 --json "$W/heldout_fp32_seed$seed.json" 2>&1 | grep -a "^held-out"
      done ;;
    profile) OUT=$W timeout 90 bash benchmarks/gpu_session.sh profile_bf16 2>&1 | grep "GPU time" ;;
  esac
  rm -f "$W/attention_round8.tar.gz"
  tar -C "$W" -czf "$OUT/round8_final.tar.gz" .
done
echo "=== done ($(date +%T))"

#!/usr/bin/env bash
# Issue 37's float32 device call (round 8): the attention GPU tests with each float32 version
# (attention.FLOAT32 rows / flash), then benchmarks/attention_f32_variants.py (each tile
# configuration of attention_f32.py checked against float64 and timed; the fastest per width in
# the captured bench rows beside the row kernels, the unfused chain and PyTorch's SDPA).
#   OUT=DIR [WIDTHS='32 64 128'] [TRIES=0] [LENGTHS='2048 4096'] bash benchmarks/attention_round8_f32.sh [STAGE ...]
# (stages: tests variants; TRIES=0 benches CONFIG as it is, LENGTHS narrows the bench's T)
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
for stage in ${*:-tests variants}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      timeout ${TESTS_S:-60} $PY -m pytest -o addopts= -p no:cacheprovider -q -rs \
        tests/test_attention_fused_gpu.py -k "kernels_match_float64 or captured" 2>&1 \
        | tee "$OUT/attention_f32_pytest.log" | grep -E "FAILED|ERROR|Error|passed|failed" | head -40
      ;;
    variants)
      timeout ${VARIANTS_S:-100} $PY benchmarks/attention_f32_variants.py \
        "$OUT/attention_f32_h200.json" ${WIDTHS:-32 64 128} 2>&1 | tee "$OUT/attention_f32_h200.log"
      ;;
  esac
done
echo "=== done ($(date +%T))"

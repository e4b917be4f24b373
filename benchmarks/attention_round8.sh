#!/usr/bin/env bash
# Issue 37's device call (round 8): the attention GPU tests (the staged kernels and round 7's
# converts, the 16-bit copies of attention's outputs, the bf16 step's rounding census), the bf16
# step's kernels at 8 x 512, the staged / converted / no-copy variants timed apart, and
# `smallem bench --attention`'s rows at D 64 and the D 128 and fp16 rows never run before.
#   OUT=DIR bash benchmarks/attention_round8.sh [STAGE ...]   -> DIR/attention_round8.tar.gz
# (stages: tests profile variants bench64 bench128; each under its own time limit). Call 2:
#   CALL=2 OUT=DIR bash benchmarks/attention_round8.sh tests2 profile variants bench64
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
W=$OUT/w
mkdir -p "$W"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
bench() {  # NAME WIDTHS LENGTHS PRECISIONS LIMIT: rows printed as they come, then NAME.json
  WIDTHS=$2 LENGTHS=$3 PRECISIONS=$4 timeout "$5" $PY -c 'import json, os, sys
from smallem.tools import bench_attention as b
from smallem.tools.bench import machine
env = lambda n: tuple(int(x) for x in os.environ[n].split())
b.REPS = 10
rows = b.attention_rows("gpu", True, print, env("WIDTHS"), env("LENGTHS"), tuple(os.environ["PRECISIONS"].split()))
json.dump({"device": "gpu", "attention": rows, "machine": machine()}, open(sys.argv[1], "w"), indent=1)' \
    "$W/$1.json" 2>&1 | tee "$W/$1.log"
}
for stage in ${*:-tests profile variants bench64 bench128}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      timeout 90 $PY -m pytest -o addopts= -p no:cacheprovider -q -rs -s \
        tests/test_attention_fused_gpu.py tests/gpu/test_halves.py tests/test_attention_kernels.py \
        2>&1 | tee "$W/attention_pytest.log" | grep -E "^(bf16|fp16|mma|tc|FAILED|ERROR)|passed|failed|Error" \
        | tail -40
      ;;
    profile)
      timeout 30 $PY benchmarks/profile_transformer.py 5 "$W/profile_bf16_8x512.txt" bf16 8x512 2>&1 | head -24
      ;;
    variants)
      CALL=${CALL:-1} timeout 40 $PY benchmarks/attention_round8_variants.py "$W/attention_variants${CALL:-1}.json" \
        2>&1 | tee "$W/attention_variants${CALL:-1}.log"
      ;;
    tests2)  # call 2: the kernels changed since call 1 (dQ's copy after one fence a block)
      timeout 60 $PY -m pytest -o addopts= -p no:cacheprovider -q -rs -s \
        tests/gpu/test_halves.py tests/test_attention_fused_gpu.py -k "halves or tensor_core or captured" \
        2>&1 | tee "$W/attention_pytest2.log" | grep -E "FAILED|ERROR|passed|failed|Error" | tail -20
      ;;
    bench64)
      bench attention_bench_d64 64 "1024 4096" "bf16" 25
      ;;
    bench128)
      bench attention_bench_d128 128 "1024 2048 4096" "bf16 fp16" 50
      ;;
  esac
  tar -C "$W" -czf "$OUT/attention_round8.tar.gz" .
done
echo "=== done ($(date +%T))"

#!/usr/bin/env bash
# Issue 37's device calls (round 7): the attention kernels' GPU tests, the tensor-core kernels'
# variants (benchmarks/attention_mma_variants.py), `smallem bench --attention`'s rows and an ncu
# profile of the bf16 kernels at one shape.
#   OUT=DIR [WIDTHS='64' LENGTHS='1024 4096' PRECISIONS='fp32 bf16'] bash benchmarks/attention_round7.sh [STAGE ...]
# (stages: tests variants bench ncu; REPS the bench's replays; JSON names its files)
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
for stage in ${*:-tests variants bench ncu}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      timeout 240 $PY -m pytest -o addopts= -p no:cacheprovider -q -rs -s \
        tests/test_attention_fused_gpu.py tests/test_attention_kernels.py tests/test_kernel_room.py \
        2>&1 | tee "$OUT/attention_pytest.log" | grep -E "^(bf16|fp16|FAILED|ERROR)|passed|failed|Error" | head -60
      ;;
    variants)
      timeout 300 $PY benchmarks/attention_mma_variants.py "$OUT/attention_variants.json" 2>&1 \
        | tee "$OUT/attention_variants.log"
      ;;
    bench)
      timeout 400 $PY -c 'import json, sys; from smallem.tools import bench_attention as b; from smallem.tools.bench import machine
import os; env = lambda n: tuple(int(x) for x in os.environ[n].split()) if os.environ.get(n) else None
precisions = tuple(os.environ["PRECISIONS"].split()) if os.environ.get("PRECISIONS") else None
b.REPS = int(os.environ.get("REPS", b.REPS))
rows = b.attention_rows("gpu", True, print, widths=env("WIDTHS"), lengths=env("LENGTHS"), precisions=precisions)
json.dump({"device": "gpu", "attention": rows, "machine": machine()}, open(sys.argv[1], "w"), indent=1)' \
        "$OUT/${JSON:-attention_h200}.json" 2>&1 | tee "$OUT/${JSON:-attention_h200}.log"
      ;;
    ncu)
      timeout 120 ncu --clock-control none --kernel-name regex:flash_mma -c 8 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        $PY -c 'import sys; sys.path.insert(0, "benchmarks"); from attention_variants import once; once("bf16", 2048, 64)' \
        > "$OUT/attention_ncu.txt" 2>&1
      grep -E "flash_|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy" "$OUT/attention_ncu.txt" | head -80
      ;;
  esac
done
echo "=== done ($(date +%T))"

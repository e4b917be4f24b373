#!/usr/bin/env bash
# Round 6's second bf16 device call, in order of need: the fp16 capture under compute-sanitizer
# (where call 1's illegal address came from), the census of roundings left, bench --precision
# fp32,tf32,bf16 --sizes (fp16 left out: its capture is what the sanitizer looks at), then the
# new GPU tests (halves, precision) in a process of their own.
#   OUT=DIR bash benchmarks/bf16_call.sh     (from the repository root)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/smallem-gpu}; mkdir -p "$OUT"
PT="python3 -m pytest -o addopts= -p no:cacheprovider -q -rs"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
echo "=== sanitizer ($SAN, $(date +%T))"
if [ -n "$SAN" ]; then
  timeout 50 "$SAN" --tool memcheck --print-limit 3 $PT -x \
    "tests/gpu/test_captured_fp16.py::test_a_captured_fp16_run_is_the_plain_one[sgd]" 2>&1 \
    | grep -v '^[.sF]*$' | head -60 > "$OUT/sanitizer.log"
  grep -E "Invalid|at 0x|by thread|kernel|Address|ERROR SUMMARY|passed|failed" "$OUT/sanitizer.log" | head -20
fi
echo "=== census ($(date +%T))"
timeout 30 python3 benchmarks/halves_census.py 2>&1 | tail -16 | tee "$OUT/halves_census.log"
echo "=== bench ($(date +%T))"
timeout 150 python3 -m smallem bench --precision fp32,tf32,bf16 --sizes \
  --json "$OUT/bench_precision.json" > "$OUT/bench_precision.log" 2>&1
grep -v "^ \|^Trace\|^cupy\|Error in\|^Original\|^$" "$OUT/bench_precision.log" | head -40
echo "=== tests ($(date +%T))"
timeout 60 $PT -m gpu tests/gpu/test_halves.py tests/test_precision_gpu.py tests/gpu/test_optimizers.py \
  2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|^E  " | head -30 | tee "$OUT/pytest.log"
echo "=== done ($(date +%T))"

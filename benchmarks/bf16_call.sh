#!/usr/bin/env bash
# Round 6's second bf16 device call: the fp16 capture under compute-sanitizer (where the illegal
# address of call 1 came from), the GPU tests one file per process (a crash in one cannot spoil
# the others), then bench --precision ... --sizes (fp16 left out if the four together fail).
#   OUT=DIR bash benchmarks/bf16_call.sh     (from the repository root)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/smallem-gpu}; mkdir -p "$OUT"
PT="python3 -m pytest -o addopts= -p no:cacheprovider -q -rs"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
echo "=== sanitizer ($SAN, $(date +%T))"
if [ -n "$SAN" ]; then
  timeout 150 "$SAN" --tool memcheck --print-limit 4 $PT -x \
    "tests/gpu/test_captured_fp16.py::test_a_captured_fp16_run_is_the_plain_one[sgd]" 2>&1 \
    | grep -v '^[.sF]*$' | head -70 > "$OUT/sanitizer.log"
  head -40 "$OUT/sanitizer.log"
fi
echo "=== census"
timeout 60 python3 benchmarks/halves_census.py 2>&1 | tail -16 | tee "$OUT/halves_census.log"
echo "=== tests ($(date +%T))"
for f in $(grep -l "mark.gpu\|mark.torch" tests/*.py tests/gpu/*.py); do
  timeout 120 $PT -m "gpu or torch" "$f" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|^E  " | head -12 \
    | sed "s|^|$(basename $f): |"
done 2>&1 | tee "$OUT/pytest.log"
echo "=== bench ($(date +%T))"
timeout 260 python3 -m smallem bench --precision fp32,tf32,bf16,fp16 --sizes \
  --json "$OUT/bench_precision.json" > "$OUT/bench_precision.log" 2>&1 \
  || timeout 200 python3 -m smallem bench --precision fp32,tf32,bf16 --sizes \
       --json "$OUT/bench_precision_no_fp16.json" >> "$OUT/bench_precision.log" 2>&1
grep -v "^ \|^Trace\|^cupy\|Error in\|^Original\|^$" "$OUT/bench_precision.log" | head -50
echo "=== done ($(date +%T))"

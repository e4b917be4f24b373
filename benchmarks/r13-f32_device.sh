#!/usr/bin/env bash
# Rounds 13 and 14, issue 37's float32 device calls (branches r13-f32, r14-f32): the 3xTF32
# attention kernels (backends/cuda/attention_f32_tc.py, _tc_grad.py). Stages, each under its own limit:
#   tests   the new tests (tests/test_attention_f32_tc_gpu.py) and the float32 flash attention GPU tests
#           of test_attention_fused_gpu.py (FLOAT32 rows and flash, the captured fp32 replays)
#   broken  the new tests with the small terms of the split products cut (r13_f32tc.py broken):
#           they must fail
#   variants  r13_f32tc.py variants: the forward's VARIANTS alone (as bench's first part)
#   profile ncu (speed of light, warp states, scheduler, occupancy) of the 3xTF32 forward and
#           backward at D 128, T 4,096 (r13_f32tc.py profile)
#   bench   r13_f32tc.py bench: the forward's VARIANTS and the backward's BACKWARD against float64
#           and timed beside the FFMA passes and PyTorch's, the fastest set (the backward's FROM
#           per width), then the bench's float32 rows (WIDTHS, default 64 128)
#   OUT=DIR CUBINS=DIR bash benchmarks/r13-f32_device.sh [STAGE ...]  -> DIR/r13-f32.tar.gz
# CUBINS: `python benchmarks/r13_f32tc.py cubins DIR` here (nvcc -arch=sm_90a).
set -uo pipefail
OUT=${OUT:-/tmp/r13-f32}; W=/tmp/r13-f32-w; mkdir -p "$W" "$OUT"
export PYTHONPATH=$PWD:$PWD/benchmarks PYTHONUNBUFFERED=1
PY=${PY:-python3}
for stage in ${*:-tests broken bench}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests)
      timeout ${TESTS_S:-120} $PY benchmarks/r13_f32tc.py tests "${CUBINS:---}" -- -rs \
        tests/test_attention_f32_tc_gpu.py tests/test_attention_fused_gpu.py \
        -k "flash or 3xtf32 or (captured and fp32)" > "$W/tests.log" 2>&1
      echo "pytest exit $?"; grep -E "^(ERROR|FAILED)|passed|failed" "$W/tests.log" | tail -12
      ;;
    broken)
      timeout ${BROKEN_S:-40} $PY benchmarks/r13_f32tc.py broken "${CUBINS:---}" -- \
        tests/test_attention_f32_tc_gpu.py > "$W/broken.log" 2>&1
      echo "pytest exit $? (must fail)"; grep -E "passed|failed" "$W/broken.log" | tail -3
      ;;
    profile)  # ncu of the 3xTF32 kernels at D 128, T 4,096 (one forward, one backward)
      timeout ${PROFILE_S:-90} ncu --kernel-name regex:f32tc_ --launch-count 2 --section SpeedOfLight \
        --section WarpStateStats --section SchedulerStats --section Occupancy \
        $PY benchmarks/r13_f32tc.py profile - ${CUBINS:-} > "$W/ncu.txt" 2>&1
      echo "ncu exit $?"; grep -E "f32tc_|Duration|Issue Slots Busy|Warp Cycles Per Issued|Stall|Achieved Occ|Compute \(SM\)" "$W/ncu.txt" | head -40
      ;;
    bench|variants)
      timeout ${BENCH_S:-300} $PY benchmarks/r13_f32tc.py $stage "$W/r13_f32.json" ${CUBINS:-} \
        2>&1 | tee "$W/bench.log" | cut -c1-230
      ;;
  esac
  tar -C "$W" -czf "$OUT/r13-f32.tar.gz" .
done
echo "=== done ($(date +%T))"

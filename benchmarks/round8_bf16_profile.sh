#!/usr/bin/env bash
# Round 8's bf16 follow-up (issue 36): what round8_bf16.sh's profiles (cut by their timeouts) and
# two test fixes left open: gelu_linear's GPU test on a backend made with its switch on (-s: it
# prints whether cuBLASLt took DGELU_BGRAD), the same-bytes test, the fp16 verdict's test; the
# bf16 step's kernels at 8 x 512; the fp16 run's first step with its verdict on the kernels.
#   OUT=DIR bash benchmarks/round8_bf16_profile.sh
set -uo pipefail
OUT=${OUT:-/tmp/r8bf16p}; W=/tmp/r8bf16p_work; mkdir -p "$OUT" "$W"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{
echo "=== tests ($(date +%T))"
timeout 25 python3 -m pytest -o addopts= -p no:cacheprovider -q -rfEs -s \
  tests/gpu/test_linear.py::test_gelu_linear_with_its_epilogue_matches_float64 \
  tests/test_attention_fused_gpu.py::test_the_transformer_holds_the_same_bytes_on_gpu_and_cpu \
  tests/gpu/test_captured_fp16.py::test_the_plain_steps_verdict_on_the_gpu_is_the_generic_one 2>&1 \
  | grep -E "DGELU|passed|failed|^E " | head -20
echo "=== profiles ($(date +%T))"
timeout 25 python3 benchmarks/profile_transformer.py 3 "$W/profile_bf16_8x512.txt" bf16 8x512 2>&1 | head -16
echo "=== fp16 run ($(date +%T))"
timeout 12 python3 benchmarks/fp16_run_diag.py fp16 2000 "$W/fp16_run_fp16_verdict.json" 2>&1 | tail -1
echo "=== done ($(date +%T))"
} 2>&1 | tee "$W/session.log"
tar -C "$W" -czf "$OUT/round8_bf16_profile.tar.gz" .

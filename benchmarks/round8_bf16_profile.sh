#!/usr/bin/env bash
# Round 8's bf16 follow-up (issue 36): what round8_bf16.sh's profiles (cut by their timeouts) and
# two test fixes left open: gelu_linear's GPU test on a backend made with its switch on (-s: it
# prints whether cuBLASLt took DGELU_BGRAD), the same-bytes test, the bf16 step's kernels at 8 x 512
# with the defaults and with gelu_linear.   OUT=DIR bash benchmarks/round8_bf16_profile.sh
set -uo pipefail
OUT=${OUT:-/tmp/r8bf16p}; W=/tmp/r8bf16p_work; mkdir -p "$OUT" "$W"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{
echo "=== tests ($(date +%T))"
timeout 25 python3 -m pytest -o addopts= -p no:cacheprovider -q -rfEs -s \
  tests/gpu/test_linear.py::test_gelu_linear_with_its_epilogue_matches_float64 \
  tests/test_attention_fused_gpu.py::test_the_transformer_holds_the_same_bytes_on_gpu_and_cpu 2>&1 \
  | grep -E "DGELU|passed|failed|^E " | head -20
echo "=== profiles ($(date +%T))"
timeout 20 python3 benchmarks/profile_transformer.py 3 "$W/profile_bf16_8x512.txt" bf16 8x512 2>&1 | head -16
timeout 15 python3 benchmarks/profile_transformer.py 3 "$W/profile_bf16_8x512_gelu.txt" bf16 8x512 gelu 2>&1 | head -14
echo "=== done ($(date +%T))"
} 2>&1 | tee "$W/session.log"
tar -C "$W" -czf "$OUT/round8_bf16_profile.tar.gz" .

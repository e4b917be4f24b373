#!/usr/bin/env bash
# Round 9's third bf16 call (issue 36): GELU's rule summing da's columns for the expand Linear's
# db (gelu.SUMS) tested (tests/gpu/test_vectors.py, the Transformer's gradients against cpu64,
# the captured step), then the captured step's variants with and without it (bf16_step_call.py).
#   OUT=DIR bash benchmarks/round9_bf16_sums.sh   -> DIR/round9_bf16_sums.tar.gz
set -uo pipefail
OUT=${OUT:-/tmp/r9sums}; W=/tmp/r9sums_work; mkdir -p "$OUT" "$W"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
trap 'tar -C "$W" -czf "$OUT/round9_bf16_sums.tar.gz" .' EXIT
{
echo "=== tests ($(date +%T))"
timeout 30 python3 -m pytest -o addopts= -p no:cacheprovider -q -rfEs tests/gpu/test_vectors.py \
  tests/gpu/test_gradients_gpu.py::test_transformer_gpu_gradients_match_cpu64_per_parameter \
  "tests/test_kernel_room.py::test_every_fused_entry_runs_fused_and_matches_the_reference[gelu]" \
  "tests/gpu/test_qkv.py::test_a_captured_step_with_q_k_v_as_one_product_is_the_plain_one" \
  tests/gpu/test_linear.py > "$W/pytest.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$W/pytest.log" | tail -12
echo "=== step ($(date +%T))"
timeout 40 python3 benchmarks/bf16_step_call.py "$W/bf16_step_sums.json" bf16 8x512,2x512,default 2>&1 \
  | tee "$W/bf16_step_sums.log" | grep -v "^ \|^Trace\|^$" | head -12
echo "=== done ($(date +%T))"
} 2>&1 | tee "$W/session.log"

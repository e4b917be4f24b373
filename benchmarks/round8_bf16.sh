#!/usr/bin/env bash
# Round 8's bf16 device call (issue 36), in order of need: the GPU tests this round's paths run
# through; the bf16 step's kernels at 8 x 512 (the defaults, and with gelu_linear) and at the
# default size; the captured step with this round's paths and without (bf16_step_call.py); the
# precision grid (smallem bench --precision tf32,bf16,fp16 --sizes: fp32 left out for time); where
# an fp16 training run's time goes (fp16_run_diag.py: bf16, fp16, fp16 again, each a process).
#   OUT=DIR bash benchmarks/round8_bf16.sh   -> DIR/round8_bf16.tar.gz (every log and JSON)
set -uo pipefail
OUT=${OUT:-/tmp/r8bf16}; W=/tmp/r8bf16_work; mkdir -p "$OUT" "$W"  # W: not under OUT (8 files come back)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PT="python3 -m pytest -o addopts= -p no:cacheprovider -q -rfEs"
{
echo "=== tests ($(date +%T))"
timeout 55 $PT -m "gpu or torch" tests/gpu/test_reductions.py tests/gpu/test_linear.py \
  tests/gpu/test_fused_operations.py tests/test_kernel_room.py tests/gpu/test_gemm.py \
  tests/test_attention_fused_gpu.py::test_the_transformer_holds_the_same_bytes_on_gpu_and_cpu \
  tests/gpu/test_gradients_gpu.py::test_transformer_gpu_gradients_match_cpu64_per_parameter \
  tests/gpu/test_gradients_gpu.py::test_the_backends_fused_tables_are_the_kernel_rooms \
  tests/gpu/test_captured_fp16.py tests/gpu/test_capture.py tests/test_precision_gpu.py > "$W/pytest.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|DGELU" "$W/pytest.log" | tail -30
echo "=== profiles ($(date +%T))"
timeout 18 python3 benchmarks/profile_transformer.py 5 "$W/profile_bf16_8x512.txt" bf16 8x512 2>&1 | head -16
timeout 12 python3 benchmarks/profile_transformer.py 5 "$W/profile_bf16_8x512_gelu.txt" bf16 8x512 gelu 2>&1 | head -12
timeout 12 python3 benchmarks/profile_transformer.py 20 "$W/profile_bf16_default.txt" bf16 default 2>&1 | head -8
echo "=== step ($(date +%T))"
timeout 35 python3 benchmarks/bf16_step_call.py "$W/bf16_step.json" bf16 8x512,default 2>&1 \
  | tee "$W/bf16_step.log" | grep -v "^ \|^Trace\|^$" | head -12
echo "=== grid ($(date +%T))"
timeout 90 python3 -m smallem bench --precision tf32,bf16,fp16 --sizes --json "$W/bench_precision.json" \
  > "$W/bench_precision.log" 2>&1
grep -v "^ \|^Trace\|^cupy\|^$" "$W/bench_precision.log" | head -24
echo "=== fp16 run ($(date +%T))"
for p in bf16 fp16 fp16; do
  timeout 12 python3 benchmarks/fp16_run_diag.py $p 2000 "$W/fp16_run_$p$([ -e "$W/fp16_run_$p.json" ] && echo _again).json" \
    2>&1 | tail -1
done
echo "=== done ($(date +%T))"
} 2>&1 | tee "$W/session.log"
tar -C "$W" -czf "$OUT/round8_bf16.tar.gz" .

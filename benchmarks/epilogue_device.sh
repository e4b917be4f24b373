#!/usr/bin/env bash
# Round 7's epilogue device call (issue 36), in order of need: every GPU test; the captured step
# with and without the epilogues beside PyTorch (bf16, tf32, fp32; the MLP, the Transformer at
# the default size and 8 x 512); the bf16 step's kernels per step, with and without.
#   OUT=DIR bash benchmarks/epilogue_device.sh     (from the repository root)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/smallem-gpu}; mkdir -p "$OUT"
echo "=== tests ($(date +%T))"
# the GPU tests a Linear's path runs through, the new file first (the whole GPU suite takes
# longer than this call's share)
timeout 90 python3 -m pytest -o addopts= -p no:cacheprovider -q -rfEs -m "gpu or torch" \
  tests/gpu/test_linear.py tests/test_kernel_room.py tests/gpu/test_capture.py \
  tests/test_precision_gpu.py tests/gpu/test_halves.py tests/gpu/test_gemm.py \
  tests/test_attention_fused_gpu.py::test_the_transformer_holds_the_same_bytes_on_gpu_and_cpu \
  tests/gpu/test_gradients_gpu.py::test_transformer_gpu_gradients_match_cpu64_per_parameter \
  tests/gpu/test_gradients_gpu.py::test_the_backends_fused_tables_are_the_kernel_rooms \
  tests/gpu/test_gradients_gpu.py::test_compare_backends_passes_on_gpu \
  tests/gpu/test_captured_fp16.py > "$OUT/pytest.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | grep -v "ERROR collecting" | tail -30
echo "=== bench ($(date +%T))"
timeout 85 python3 benchmarks/epilogue_call.py "$OUT/epilogue_bench.json" bf16,tf32,fp32 mlp,default,8x512 \
  2>&1 | tee "$OUT/epilogue_bench.log" | grep -v "^ \|^Trace\|^$" | head -20
echo "=== profiles ($(date +%T))"
for args in "20 $OUT/profile_default_bf16.txt bf16 default" \
            "20 $OUT/profile_default_bf16_old.txt bf16 default old"; do
  timeout 18 python3 benchmarks/profile_transformer.py $args 2>&1 | head -14
done
echo "=== done ($(date +%T))"

#!/usr/bin/env bash
# Round 9's bf16 device call (issue 36), in order of need: the GPU tests of this round's paths
# (q, k, v as one product: cuda/qkv.py; four floats a thread: common.VECTORS); each vectorised
# kernel alone, one a thread against four (vector_kernels.py); the captured step with this
# round's paths and without, PyTorch beside (bf16_step_call.py); the precision grid with the
# defaults; the bf16 step's kernels at 8 x 512 (defaults, then with gelu_linear) and 2 x 512.
#   OUT=DIR bash benchmarks/round9_bf16.sh   -> DIR/round9_bf16.tar.gz (every log and JSON)
set -uo pipefail
OUT=${OUT:-/tmp/r9bf16}; W=/tmp/r9bf16_work; mkdir -p "$OUT" "$W"  # W: not under OUT (8 files come back)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
pack() { tar -C "$W" -czf "$OUT/round9_bf16.tar.gz" .; }
trap pack EXIT
{
echo "=== tests ($(date +%T))"
timeout 50 python3 -m pytest -o addopts= -p no:cacheprovider -q -rfEs -m "gpu or torch" \
  tests/gpu/test_qkv.py tests/gpu/test_vectors.py tests/test_kernel_room.py \
  tests/test_attention_fused_gpu.py::test_the_transformer_holds_the_same_bytes_on_gpu_and_cpu \
  tests/gpu/test_gradients_gpu.py::test_transformer_gpu_gradients_match_cpu64_per_parameter \
  tests/gpu/test_gradients_gpu.py::test_the_backends_fused_tables_are_the_kernel_rooms \
  tests/gpu/test_fused_operations.py tests/gpu/test_elementwise.py tests/gpu/test_capture.py \
  > "$W/pytest.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$W/pytest.log" | tail -20
echo "=== vectors ($(date +%T))"
timeout 15 python3 benchmarks/vector_kernels.py "$W/vector_kernels.json" 2>&1 | tail -6
echo "=== step ($(date +%T))"
timeout 45 python3 benchmarks/bf16_step_call.py "$W/bf16_step.json" bf16 8x512,2x512,default 2>&1 \
  | tee "$W/bf16_step.log" | grep -v "^ \|^Trace\|^$" | head -12
pack
echo "=== grid ($(date +%T))"
timeout 80 python3 -m smallem bench --precision tf32,bf16,fp16 --sizes --json "$W/bench_precision.json" \
  > "$W/bench_precision.log" 2>&1
grep -v "^ \|^Trace\|^cupy\|^$" "$W/bench_precision.log" | head -24
pack
echo "=== profiles ($(date +%T))"
timeout 15 python3 benchmarks/profile_transformer.py 4 "$W/profile_bf16_8x512.txt" bf16 8x512 2>&1 | head -14
timeout 12 python3 benchmarks/profile_transformer.py 4 "$W/profile_bf16_8x512_gelu.txt" bf16 8x512 gelu 2>&1 | head -10
timeout 12 python3 benchmarks/profile_transformer.py 4 "$W/profile_bf16_2x512.txt" bf16 2x512 2>&1 | head -10
echo "=== done ($(date +%T))"
} 2>&1 | tee "$W/session.log"

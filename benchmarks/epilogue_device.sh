#!/usr/bin/env bash
# Round 7's epilogue device call (issue 36), in order of need: every GPU test; the captured step
# with and without the epilogues beside PyTorch (bf16, tf32, fp32; the MLP, the Transformer at
# the default size and 8 x 512); the bf16 step's kernels per step, with and without.
#   OUT=DIR bash benchmarks/epilogue_device.sh     (from the repository root)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/smallem-gpu}; mkdir -p "$OUT"
echo "=== tests ($(date +%T))"
# every GPU test (a Linear is in nearly every step), the new file first; files importing the
# course cannot be collected on the device image (no ipywidgets, nbformat): named in the log
timeout 90 python3 -m pytest -o addopts= -p no:cacheprovider -q -rfEs -m "gpu or torch" \
  --continue-on-collection-errors tests/gpu/test_linear.py tests/ > "$OUT/pytest.log" 2>&1
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

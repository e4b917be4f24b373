#!/usr/bin/env bash
# Round 9's second bf16 call (issue 36): qkv's rule with dq, dk, dv apart (qkv.JOIN_GRADS off)
# tested against float64 and the three Linears, then the captured step's variants again, "apart"
# beside "new" (bf16_step_call.py), one process per size list.
#   OUT=DIR bash benchmarks/round9_bf16_apart.sh   -> DIR/round9_bf16_apart.tar.gz
# Ran at 34e4c6d; the "apart" rule was removed after (slower), so today it times the others only.
set -uo pipefail
OUT=${OUT:-/tmp/r9apart}; W=/tmp/r9apart_work; mkdir -p "$OUT" "$W"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
trap 'tar -C "$W" -czf "$OUT/round9_bf16_apart.tar.gz" .' EXIT
{
echo "=== tests ($(date +%T))"
timeout 25 python3 -m pytest -o addopts= -p no:cacheprovider -q -rfEs tests/gpu/test_qkv.py > "$W/pytest.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$W/pytest.log" | tail -12
echo "=== step ($(date +%T))"
timeout 35 python3 benchmarks/bf16_step_call.py "$W/bf16_step_apart.json" bf16 8x512,2x512,default 2>&1 \
  | tee "$W/bf16_step_apart.log" | grep -v "^ \|^Trace\|^$" | head -12
echo "=== done ($(date +%T))"
} 2>&1 | tee "$W/session.log"

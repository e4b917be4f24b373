#!/usr/bin/env bash
# Round 8's first device call: the merged main of round 7 (tensor-core attention + the Linear's
# bias epilogue together) through every GPU test, the bf16/fp16 gradcheck, the bf16 step's
# kernels at the default size and 8 x 512, and the held-out loss in each precision (issue 36).
#   OUT=DIR bash benchmarks/round8_call1.sh       -> DIR/round8_call1.tar.gz (every log and JSON)
set -uo pipefail
OUT=${OUT:-/tmp/r8c1}; W=$OUT/w; mkdir -p "$W"
export PYTHONUNBUFFERED=1
OUT=$W timeout 330 bash benchmarks/gpu_session.sh env tests gradcheck_low profile_bf16 2>&1 | tee "$W/session.log"
OUT=$W timeout 170 bash benchmarks/heldout_precisions.sh 2>&1 | tee "$W/heldout.log"
tar -C "$W" -czf "$OUT/round8_call1.tar.gz" .

#!/usr/bin/env bash
# The token Transformer against the byte Transformer at equal training-loop time on a GPU (lesson
# 16's recorded run): the default byte run (10,000 steps), a 1,000-step token run that learns the
# merges (cached) and measures the token step's rate, then the token run given the byte run's
# loop time; samples from both; the KV-cache tests and the sample-cache bench on the GPU.
# Usage: OUT=folder bash benchmarks/tokens_gpu.sh   (logs and JSON under $OUT)
set -euo pipefail
OUT=${OUT:-/tmp/tokens_gpu}; mkdir -p "$OUT"
export SMALLEM_CACHE=/tmp/smallem_cache
T="python3 -m smallem train --model transformer --backend gpu"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/tokens_runs.log" 2>&1 || true
$T --save /tmp/bytes.npz --json "$OUT/tokens_bytes.json" >> "$OUT/tokens_runs.log" 2>&1
$T --tokens bpe --vocab 2048 --steps 1000 --eval-every 1000 --json /tmp/calib.json >> "$OUT/tokens_runs.log" 2>&1
STEPS=$(python3 -c "import json; b=json.load(open('$OUT/tokens_bytes.json')); c=json.load(open('/tmp/calib.json'))
print(round(b['steps'] / b['steps_per_second'] * c['steps_per_second']))")
echo "token steps for the byte run's loop time: $STEPS" | tee -a "$OUT/tokens_runs.log"
$T --tokens bpe --vocab 2048 --steps "$STEPS" --save /tmp/tokens.npz --json "$OUT/tokens_bpe.json" >> "$OUT/tokens_runs.log" 2>&1
for run in bytes tokens; do
  echo "=== sample $run" >> "$OUT/tokens_samples.log"
  python3 -m smallem sample --checkpoint /tmp/$run.npz --backend gpu --prompt "    def __init__(self" \
    --bytes 200 --temperature 0.8 >> "$OUT/tokens_samples.log" 2>&1
done
cp "$SMALLEM_CACHE"/merges/*.json "$OUT/tokens_merges_2048.json"
python3 -m pytest -o addopts= -p no:cacheprovider -q tests/test_kv_cache.py tests/test_tokens.py \
  tests/test_bpb.py > "$OUT/tokens_pytest.log" 2>&1 || true
python3 benchmarks/sample_cache.py --backend gpu --bytes 200 --json "$OUT/tokens_sample_cache_gpu.json" \
  > "$OUT/tokens_sample_cache_gpu.log" 2>&1 || true
tail -3 "$OUT/tokens_pytest.log"; cat "$OUT/tokens_sample_cache_gpu.log"; grep -E "held-out loss|bits per byte|token steps|learnt" "$OUT/tokens_runs.log"

#!/usr/bin/env bash
# One device call, round 5: the default Transformer and MLP trained on the GPU (their checkpoints
# become the package's shipped models: tools/ship_model.py), samples from the Transformer, the
# residual / LayerNorm ablation (benchmarks/ablate_blocks.py), the small Transformer's CPU step
# against PyTorch at 16 threads and at 2 pinned cores (issue 31), and the GPU tests of the two
# files fixed last round.   OUT=folder bash benchmarks/trained_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/trained_gpu}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SMALLEM_CACHE=/tmp/smallem_cache
LOG="$OUT/trained_gpu.log"
T="python3 -m smallem train --backend gpu"
{ nvidia-smi --query-gpu=name,clocks.sm --format=csv; nproc; python3 -V; } > "$LOG" 2>&1
timeout 90 $T --model transformer --save "$OUT/transformer.npz" --json "$OUT/train_transformer.json" >> "$LOG" 2>&1
timeout 60 $T --model mlp --save "$OUT/mlp.npz" --json "$OUT/train_mlp.json" >> "$LOG" 2>&1
for prompt in "    def __init__(self" "import " "        for i in range("; do
  for seed in 0 1; do
    echo "=== prompt $prompt | seed $seed | temperature 0.8" >> "$LOG"
    timeout 30 python3 -m smallem sample --checkpoint "$OUT/transformer.npz" --backend gpu --prompt "$prompt" \
      --bytes 240 --temperature 0.8 --seed $seed >> "$LOG" 2>&1
  done
done
timeout 100 python3 benchmarks/ablate_blocks.py --backend gpu --steps 3000 --batch 32 --json "$OUT/ablate_gpu.json" >> "$LOG" 2>&1
B="python3 -m smallem bench --model transformer --steps 40 --block 2 --warmup 3 --no-cpu64"
echo "== CPU, 16 threads" >> "$LOG"
CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=16 timeout 60 $B >> "$LOG" 2>&1
echo "== CPU, 2 threads on cores 0-1" >> "$LOG"
CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 timeout 80 taskset -c 0,1 $B >> "$LOG" 2>&1
timeout 90 python3 -m pytest -o addopts= -p no:cacheprovider -q tests/test_precision_gpu.py \
  tests/test_attention_fused_gpu.py >> "$LOG" 2>&1
grep -E "held-out|ms/step|smallem cpu|PyTorch eager|passed|failed|error" "$LOG" | tail -30

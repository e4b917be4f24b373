#!/usr/bin/env bash
# Issue 38's host-CPU call (GPU hidden), rounds 14-15: r11-cpu16_device.sh PART=3 on this tree beside
# BASE (default: base/ beside this tree's root: `git archive <main> -- smallem benchmarks pyproject.toml
# ':!benchmarks/results'`; BASE= for none), REPS rounds at 16 threads, 2 pinned cores (0, 1) and 1 (core 0), each row
# alone, this tree, BASE and PyTorch SDPA; at 1 core this tree again with ALONE_OPS=1 (the step by
# op in the row's own process after it). GEMM=1 first: r15_cpu_gemm.py on core 0. numba's caches in
# NUMBA_CACHE_DIR (/tmp: a warm machine keeps them between calls). Round 15's call 2: ~145 s of
# command on a warm machine; CONFIGS=16 for 16 threads alone. MLP="16 2" first: `smallem bench --model
# mlp --no-cpu64` at those threads (2: cores 0, 1 pinned), each row alone, as round 10 ran it;
# NO_ROWS=1: that alone (~45 s on a warm machine: MLP="16 2" NO_ROWS=1). LINEARS=1 (round 15,
# r15-cpu2): `cpu_step.py linears 20` on core 0, this tree's step's Linears at one thread in the
# step, replayed, alone, by piece and one NumPy call a product (logs/linears.jsonl, ~25 s warm).
#   OUT=folder GEMM=1 bash benchmarks/r14-cpu_device.sh   -> OUT/cpu16_part3.tgz (logs/rows.jsonl, gemm.jsonl)
cd "$(dirname "$0")/.." || exit
export PYTHONPATH=$PWD BASE=${BASE-$PWD/base} OUT=${OUT:-/tmp/r14-cpu} PART=3 NO_EAGER=1 NO_OPS=${NO_OPS-1} PINS=${PINS:-0,1}
export REPS=${REPS:-2} CONFIGS=${CONFIGS:-"16 2 1"} OPS_RUNS=${OPS_RUNS:-"smallem 16"} BUDGET=${BUDGET:-175}
export ALT1_ENV=${ALT1_ENV-ALONE_OPS=1} STEPS=${STEPS:-12} NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/r15-numba}
export CUDA_VISIBLE_DEVICES=
mkdir -p "$OUT/logs"
if [ -n "${GEMM:-}" ]; then
  OMP_NUM_THREADS=1 timeout 60 taskset -c 0 python3 benchmarks/r15_cpu_gemm.py 2>>"$OUT/logs/cpu16.log" \
    | tee "$OUT/logs/gemm.jsonl"
fi
if [ -n "${LINEARS:-}" ]; then
  SMALLEM_THREADS=1 OMP_NUM_THREADS=1 timeout 90 taskset -c 0 python3 benchmarks/cpu_step.py linears 20 \
    2>>"$OUT/logs/cpu16.log" | tee "$OUT/logs/linears.jsonl"
fi
for t in ${MLP:-}; do  # the MLP's step as bench times it (each row alone), 2 pinned to cores 0, 1
  pin=""; [ "$t" -lt 16 ] && pin="taskset -c 0-$((t - 1))"
  echo "== mlp, $t threads ($(date +%T))" >> "$OUT/logs/cpu16.log"
  OMP_NUM_THREADS=$t timeout 90 $pin python3 -m smallem bench --model mlp --no-cpu64 --steps 60 \
    --warmup 10 --block 10 --threads "$t" --json "$OUT/logs/mlp_$t.json" >> "$OUT/logs/cpu16.log" 2>&1
done
if [ -n "${NO_ROWS:-}" ]; then  # the MLP (or the gemm) alone: no caches built, no Transformer rows
  tar -C "$OUT" -czf "$OUT/cpu16_part3.tgz" logs && rm -rf "$OUT/logs"
else
  bash benchmarks/r11-cpu16_device.sh
fi

#!/usr/bin/env bash
# Issue 38 on the device host's CPU (GPU hidden), round 10's Linears call: one Linear's forward
# and rule at 1-16 threads against PyTorch's (benchmarks/cpu_linear.py), then bench's transformer
# row each alone in its process: the pool (compiled_team.py, the default) against round 9's
# compiled pieces (SMALLEM_POOL=0), PyTorch's SDPA row beside, at 16 threads, 2 pinned cores and
# 1; the step by operation at 16. Anything starting past BUDGET seconds (default 120) is skipped.
# PART=2: the second call (cpu_linear.py concurrent, the step by operation, the rows again).
#   OUT=folder bash benchmarks/cpu_round10_linear.sh -> $OUT/cpu_linear.log, .jsonl, micro.jsonl
set -uo pipefail
OUT=${OUT:-/tmp/cpu_linear}; mkdir -p "$OUT"
export PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1 SMALLEM_KERNELS=numba
PY=${PY:-python3}; log=$OUT/cpu_linear.log; rows=$OUT/cpu_linear.jsonl; STEPS=${STEPS:-12}
say() { echo "== $* ($(date +%T), ${SECONDS}s, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"; }
alone() {  # alone THREADS PIN POOL NAME [GRAIN [SPIN_US]]
  [ "$SECONDS" -gt "${BUDGET:-120}" ] && { say "skipped: $*"; return; }
  env SMALLEM_THREADS="$1" OMP_NUM_THREADS="$1" SMALLEM_POOL="$3" SMALLEM_GRAIN="${5:-8}" \
    SMALLEM_SPIN="${6:-50}" timeout 40 \
    ${2:+taskset -c $2} $PY benchmarks/cpu_step.py alone "$4" "$STEPS" 2>>"$log" \
    | sed "s/^{/{\"asked\": \"$4, $1 threads, ${2:-unpinned}, pool $3, grain ${5:-8}, spin ${6:-50}\", /" \
    | tee -a "$rows" "$log"
}
say "host: $(nproc) CPUs, $(lscpu | grep -m1 'Model name' | tr -s ' '), $(lscpu | grep -m1 'Core(s) per socket' | tr -s ' ')"
$PY -c 'import numba, numpy, torch; from smallem.backends.cpu import compiled; print("numba", numba.__version__, "numpy", numpy.__version__, "torch", torch.__version__, "compiled Linear:", bool(compiled.linear()))' 2>&1 | tee -a "$log"
if [ "${PART:-1}" = 2 ]; then  # the second call: does one-thread GEMM scale, the step by op, rows again
  say "concurrent one-thread GEMMs"
  timeout 40 $PY benchmarks/cpu_linear.py concurrent 1 2 4 8 16 2>>"$log" | tee -a "$OUT/micro.jsonl" "$log" >/dev/null
  say "ops 16 threads, pool"
  SMALLEM_THREADS=16 OMP_NUM_THREADS=16 timeout 30 $PY benchmarks/cpu_step.py ops 8 \
    2>>"$log" | sed 's/^{/{"asked": "ops, 16 threads, pool", /' | tee -a "$rows" "$log"
  alone 16 "" 1 "smallem cpu"
  alone 16 "" 0 "smallem cpu"
  alone 2 0,1 1 "smallem cpu"
  alone 2 0,1 0 "smallem cpu"
  alone 16 "" 1 "smallem cpu" 8 200
  alone 16 "" 1 "PyTorch eager, SDPA"
  say done
  exit 0
fi
say "micro-bench"
REPS=${REPS:-25} timeout 60 $PY benchmarks/cpu_linear.py 1 2 4 8 16 2>>"$log" | tee -a "$OUT/micro.jsonl" >/dev/null
say "rows"
alone 16 "" 1 "smallem cpu"
alone 16 "" 0 "smallem cpu"
alone 16 "" 1 "PyTorch eager, SDPA"
alone 2 0,1 1 "smallem cpu"
alone 2 0,1 1 "PyTorch eager, SDPA"
alone 1 0 1 "smallem cpu"
alone 1 0 1 "PyTorch eager, SDPA"
if [ "$SECONDS" -le "${BUDGET:-120}" ]; then  # the step by operation, the pool, 16 threads
  say "ops 16 threads, pool"
  SMALLEM_THREADS=16 OMP_NUM_THREADS=16 timeout 30 $PY benchmarks/cpu_step.py ops 8 \
    2>>"$log" | sed 's/^{/{"asked": "ops, 16 threads, pool", /' | tee -a "$rows" "$log"
fi
alone 2 0,1 0 "smallem cpu"
alone 1 0 0 "smallem cpu"
alone 16 "" 1 "smallem cpu" 8 200
alone 16 "" 1 "smallem cpu" 2
alone 16 "" 1 "smallem cpu"
alone 16 "" 0 "smallem cpu"
say done

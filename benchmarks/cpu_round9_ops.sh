#!/usr/bin/env bash
# Round 9's first call (issue 38) on the device host's CPU (GPU hidden): what holds numba's step
# now, by operation (cpu_step.py ops: forward and rule of each, the optimizer apart), at 1 thread
# (pinned, core 0), 8 and 16, then 16 and 8 again (the host's vCPU speed moves between minutes),
# and bench's smallem row alone at 8 and 16 beside PyTorch's SDPA row at 16 for scale.
#   OUT=folder bash benchmarks/cpu_round9_ops.sh -> $OUT/cpu_round9_ops.log, .jsonl
set -uo pipefail
OUT=${OUT:-/tmp/cpu_round9}; mkdir -p "$OUT"
export PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1 SMALLEM_KERNELS=numba
PY=${PY:-python3}; log=$OUT/cpu_round9_ops.log; rows=$OUT/cpu_round9_ops.jsonl
say() { echo "== $* ($(date +%T), ${SECONDS}s, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"; }
tag() { sed "s/^{/{\"asked\": \"$1\", /" | tee -a "$rows" "$log"; }
ops() {  # ops THREADS [PIN]
  say "ops numba $1 ${2:-unpinned}"
  SMALLEM_THREADS=$1 OMP_NUM_THREADS=$1 timeout 40 ${2:+taskset -c $2} $PY benchmarks/cpu_step.py ops 8 \
    2>>"$log" | tag "ops numba $1 ${2:-unpinned}"
}
alone() {  # alone THREADS NAME
  SMALLEM_THREADS=$1 OMP_NUM_THREADS=$1 timeout 40 $PY benchmarks/cpu_step.py alone "$2" 12 2>>"$log" \
    | tag "alone $1 $2"
}
say "host: $(nproc) CPUs"
$PY -c "import numba; print('numba', numba.__version__)" 2>&1 | tee -a "$log"
ops 1 0; ops 16; ops 8; ops 16; ops 8
alone 16 "smallem cpu"; alone 8 "smallem cpu"; alone 16 "PyTorch eager, SDPA"
say done

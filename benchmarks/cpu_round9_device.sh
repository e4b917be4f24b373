#!/usr/bin/env bash
# Round 9 (issue 38) on the device host's CPU (GPU hidden), one call: what holds numba's step
# now, by operation (cpu_step.py ops, the optimizer apart) at 16 threads, then bench's transformer
# row each alone in its process, this branch's code (.) beside its base (BASE, another tree) in
# turn at 16, 2 pinned, 1 pinned and 8 threads, PyTorch's SDPA and eager rows beside them (the
# host's vCPU speed moves between minutes: compare within a thread count), then the step by
# operation on one pinned core. Anything starting past BUDGET seconds (default 70) is skipped.
#   OUT=folder BASE=../r9-cpu-base bash benchmarks/cpu_round9_device.sh -> $OUT/cpu_round9.log, .jsonl
set -uo pipefail
OUT=${OUT:-/tmp/cpu_round9}; mkdir -p "$OUT"; BASE=${BASE:-}
export CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1 SMALLEM_KERNELS=numba
PY=${PY:-python3}; log=$OUT/cpu_round9.log; rows=$OUT/cpu_round9.jsonl; STEPS=${STEPS:-12}; HERE=$PWD
say() { echo "== $* ($(date +%T), ${SECONDS}s, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"; }
late() { [ "$SECONDS" -gt "${BUDGET:-70}" ] && say "skipped (past ${BUDGET:-70} s): $*"; }
tag() { sed "s/^{/{\"asked\": \"$1\", /" | tee -a "$rows" "$log"; }
alone() {  # alone TREE THREADS PIN NAME: one bench row alone in its process, TREE's code
  local tree=$1 t=$2 pin=$3 name=$4
  late "$name $tree $t ${pin:-unpinned}" && return
  (cd "$tree" && env PYTHONPATH="$PWD" SMALLEM_THREADS="$t" OMP_NUM_THREADS="$t" timeout 30 \
    ${pin:+taskset -c $pin} $PY benchmarks/cpu_step.py alone "$name" "$STEPS" 2>>"$log") \
    | tag "$name, $([ "$tree" = "$HERE" ] && echo branch || echo base), $t threads, ${pin:-unpinned}"
}
ops() {  # ops THREADS [PIN]: this branch's step by operation
  late "ops $1" && return
  say "ops $1 ${2:-unpinned}"
  PYTHONPATH=$HERE SMALLEM_THREADS=$1 OMP_NUM_THREADS=$1 timeout 30 ${2:+taskset -c $2} \
    $PY benchmarks/cpu_step.py ops 8 2>>"$log" | tag "ops branch $1 ${2:-unpinned}"
}
say "host: $(nproc) CPUs; $($PY -c 'import numba, numpy; print("numba", numba.__version__, "numpy", numpy.__version__)')"
ops 16
for spec in "16 " "2 0,1" "1 0" "8 "; do
  set -- $spec; t=$1; pin=${2:-}
  say "rows alone: $t threads ${pin:-unpinned}"
  alone "$HERE" "$t" "$pin" "smallem cpu"
  [ -n "$BASE" ] && alone "$BASE" "$t" "$pin" "smallem cpu"
  [ "$t" = 8 ] || alone "$HERE" "$t" "$pin" "PyTorch eager, SDPA"
  [ "$t" = 8 ] || [ "$t" = 1 ] || alone "$HERE" "$t" "$pin" "PyTorch eager"
done
ops 1 0
say done

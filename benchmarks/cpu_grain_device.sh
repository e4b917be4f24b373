#!/usr/bin/env bash
# Issue 38's next host call (written in round 9, not yet run there): what holds the products at
# 16 threads, the grain or the GIL? Bench's transformer row alone in its process on this tree's
# code, at 16 threads with SMALLEM_GRAIN 2, 4 and 8 (team.py: one thread woken per GRAIN units of
# ~20 µs; 8 gives the 64 × 64 Linears 2-4 threads), two rounds in turn (the host's vCPU speed
# moves between minutes), then 8 threads and 1 pinned core (round 9 did not reach them), PyTorch's
# SDPA row beside each. Anything starting past BUDGET seconds (default 70) is skipped; a row
# takes ~7.5 s there.
#   OUT=folder bash benchmarks/cpu_grain_device.sh -> $OUT/cpu_grain.log, .jsonl
set -uo pipefail
OUT=${OUT:-/tmp/cpu_grain}; mkdir -p "$OUT"
export PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1 SMALLEM_KERNELS=numba
PY=${PY:-python3}; log=$OUT/cpu_grain.log; rows=$OUT/cpu_grain.jsonl; STEPS=${STEPS:-12}
say() { echo "== $* ($(date +%T), ${SECONDS}s, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"; }
alone() {  # alone THREADS PIN GRAIN NAME
  [ "$SECONDS" -gt "${BUDGET:-70}" ] && { say "skipped: $*"; return; }
  env SMALLEM_THREADS="$1" OMP_NUM_THREADS="$1" SMALLEM_GRAIN="$3" timeout 30 ${2:+taskset -c $2} \
    $PY benchmarks/cpu_step.py alone "$4" "$STEPS" 2>>"$log" \
    | sed "s/^{/{\"asked\": \"$4, $1 threads, ${2:-unpinned}, grain $3\", /" | tee -a "$rows" "$log"
}
say "host: $(nproc) CPUs"
for round in 1 2; do for grain in 2 4 8; do alone 16 "" "$grain" "smallem cpu"; done; done
alone 16 "" 8 "PyTorch eager, SDPA"
alone 8 "" 8 "smallem cpu"
alone 1 0 8 "smallem cpu"; alone 1 0 8 "PyTorch eager, SDPA"
say done

#!/usr/bin/env bash
# Issue 38 on the device host's CPU (GPU hidden), one call of round 9's second CPU session: what
# holds the Linears at 16 threads, the grain or the GIL? Bench's transformer row, each alone in
# its process, this tree's code, numba's table: the Linears' pieces as compiled calls that take
# the GIL once a thread (SMALLEM_LINEAR=numba, compiled_linear.py) against NumPy calls that take
# it twice a piece (SMALLEM_LINEAR=numpy, the round-9 engine), at team.GRAIN 8 and 2, in turn;
# PyTorch's SDPA row; then 8 threads, 2 pinned and 1 pinned cores; a second 16-thread round if
# the time allows, and the step by operation. Anything starting past BUDGET seconds (default 70) is skipped; a row takes
# ~7 s there (the first one more: numba compiles and caches).
#   OUT=folder bash benchmarks/cpu_nogil_device.sh -> $OUT/cpu_nogil.log, .jsonl
set -uo pipefail
OUT=${OUT:-/tmp/cpu_nogil}; mkdir -p "$OUT"
export PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1 SMALLEM_KERNELS=numba
PY=${PY:-python3}; log=$OUT/cpu_nogil.log; rows=$OUT/cpu_nogil.jsonl; STEPS=${STEPS:-12}
say() { echo "== $* ($(date +%T), ${SECONDS}s, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"; }
alone() {  # alone THREADS PIN GRAIN LINEAR NAME
  [ "$SECONDS" -gt "${BUDGET:-70}" ] && { say "skipped: $*"; return; }
  env SMALLEM_THREADS="$1" OMP_NUM_THREADS="$1" SMALLEM_GRAIN="$3" SMALLEM_LINEAR="$4" timeout 40 \
    ${2:+taskset -c $2} $PY benchmarks/cpu_step.py alone "$5" "$STEPS" 2>>"$log" \
    | sed "s/^{/{\"asked\": \"$5, $1 threads, ${2:-unpinned}, grain $3, linear $4\", /" \
    | tee -a "$rows" "$log"
}
say "host: $(nproc) CPUs, $(lscpu | grep -m1 'Model name' | tr -s ' '), $(lscpu | grep -m1 'Core(s) per socket' | tr -s ' ')"
$PY -c 'import numba, numpy; from smallem.backends.cpu import compiled; print("numba", numba.__version__, "numpy", numpy.__version__, "compiled Linear:", bool(compiled.linear()))' 2>&1 | tee -a "$log"
alone 16 "" 8 numba "smallem cpu"
alone 16 "" 8 numpy "smallem cpu"
alone 16 "" 2 numba "smallem cpu"
alone 16 "" 2 numpy "smallem cpu"
alone 16 "" 8 numba "PyTorch eager, SDPA"
alone 8 "" 8 numba "smallem cpu"
alone 2 0,1 8 numba "smallem cpu"
alone 2 0,1 8 numpy "smallem cpu"
alone 1 0 8 numba "smallem cpu"
alone 1 0 8 numpy "smallem cpu"
alone 1 0 8 numba "PyTorch eager, SDPA"
alone 16 "" 4 numba "smallem cpu"
alone 16 "" 8 numba "smallem cpu"
alone 16 "" 8 numpy "smallem cpu"
if [ "$SECONDS" -le "${BUDGET:-70}" ]; then  # the step by operation, the compiled Linear, 16 threads
  say "ops 16 threads, linear numba"
  SMALLEM_THREADS=16 OMP_NUM_THREADS=16 SMALLEM_LINEAR=numba timeout 30 $PY benchmarks/cpu_step.py ops 8 \
    2>>"$log" | sed 's/^{/{"asked": "ops, 16 threads, linear numba", /' | tee -a "$rows" "$log"
fi
say done

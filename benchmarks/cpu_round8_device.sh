#!/usr/bin/env bash
# Round 8 (issue 38) on the device host's CPU (GPU hidden), in order of what matters:
# 1. why one thread took 125 ms there and 66 on the 2-core machine: the machine's configuration
#    (cpu_diag.py info), the step's kinds of work on one thread and the step by operation on core 0
#    and on core 8 (is core 0 busy?); the pinned rows below then use the faster of the two;
# 2. bench's transformer rows each alone in its process (cpu_step.py alone): the NumPy route and
#    numba's (SMALLEM_KERNELS) at 16 threads, 2 pinned cores and 1, PyTorch's SDPA and eager rows
#    beside them; 3. the sweep: both routes unpinned at 2, 4 and 8 threads, numba's table with the
#    attention on NumPy; 4. numba's step by operation at 16 threads.
# Anything starting past BUDGET seconds (default 130) is skipped.
#   OUT=folder BUDGET=130 bash benchmarks/cpu_round8_device.sh -> $OUT/cpu_round8.log, .jsonl
set -uo pipefail
OUT=${OUT:-/tmp/cpu_round8}; mkdir -p "$OUT"
export PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
PY=${PY:-python3}; log=$OUT/cpu_round8.log; rows=$OUT/cpu_round8.jsonl; STEPS=${STEPS:-16}
say() { echo "== $* ($(date +%T), ${SECONDS}s, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"; }
late() { [ "$SECONDS" -gt "${BUDGET:-130}" ] && say "skipped (past ${BUDGET:-130} s): $*"; }
tag() { sed "s/^{/{\"asked\": \"$1\", /" | tee -a "$rows" "$log"; }
alone() {  # alone ROUTE THREADS PIN NAME: one bench row alone in its process
  local route=$1 t=$2 pin=$3 name=$4
  late "$name $route $t ${pin:-unpinned}" && return
  env SMALLEM_KERNELS="$route" SMALLEM_THREADS="$t" OMP_NUM_THREADS="$t" \
    timeout 40 ${pin:+taskset -c $pin} $PY benchmarks/cpu_step.py alone "$name" "$STEPS" 2>>"$log" \
    | tag "$route, $t threads, ${pin:-unpinned}"
}
say "host: $(nproc) CPUs, $(lscpu | grep -E '^(Thread|Core|Socket|Model name|CPU max MHz)' | tr -s ' ' | tr '\n' ';')"
$PY -c "import sys, numba; print('python', sys.version.split()[0], 'numba', numba.__version__)" | tee -a "$log"
timeout 20 $PY benchmarks/cpu_diag.py info 2>>"$log" | tag "info"
for core in 0 8; do
  say "one thread on core $core: kinds of work, then the step by operation (NumPy route)"
  timeout 30 taskset -c $core $PY benchmarks/cpu_diag.py micro 2>>"$log" | tag "micro core $core"
  SMALLEM_KERNELS=numpy SMALLEM_THREADS=1 OMP_NUM_THREADS=1 timeout 30 taskset -c $core \
    $PY benchmarks/cpu_step.py ops 8 2>>"$log" | tag "ops 1 thread core $core"
done
c1=$($PY - "$rows" <<'PYEOF'
import json, sys  # the faster core of the two for the step on one thread
ops = {r["asked"]: r.get("step ms", 1e9) for r in map(json.loads, open(sys.argv[1])) if r["asked"].startswith("ops")}
print(8 if ops.get("ops 1 thread core 8", 1e9) < ops.get("ops 1 thread core 0", 1e9) else 0)
PYEOF
)
c2="$c1,$((c1 + 1))"
say "pinned rows on core $c1 and cores $c2"
rows_at() {  # rows_at THREADS PIN: both routes and PyTorch's rows (eager not on one thread)
  say "rows alone: $1 threads ${2:-unpinned}"
  for route in numpy numba; do alone "$route" "$1" "$2" "smallem cpu"; done
  alone numpy "$1" "$2" "PyTorch eager, SDPA"
  [ "$1" = 1 ] || alone numpy "$1" "$2" "PyTorch eager"
}
rows_at 16 ""; rows_at 2 "$c2"; rows_at 1 "$c1"
say "the sweep: unpinned 2, 4, 8 threads"
for t in 8 4 2; do for route in numba numpy; do alone "$route" "$t" "" "smallem cpu"; done; done
say "numba's table, the attention on NumPy"
alone numba-table 16 "" "smallem cpu"; alone numba-table 2 "$c2" "smallem cpu"
late "ops numba 16" || { say "numba's step by operation at 16 threads"
  SMALLEM_KERNELS=numba SMALLEM_THREADS=16 OMP_NUM_THREADS=16 timeout 30 $PY benchmarks/cpu_step.py ops 8 \
    2>>"$log" | tag "ops numba 16"; }
say done

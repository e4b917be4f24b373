#!/usr/bin/env bash
# The float32 CPU engine (issue 38) on a many-core host: `smallem bench`'s CPU rows (each alone in
# its own process, two rounds) at 16 threads, on 2 pinned cores, on 1; the MLP's at 16 and 2; then
# smallem's Transformer row under the default thread policy and at 8 threads, its step split by
# operation at 16, and the two routes (benchmarks/cpu_routes.py). GPU hidden: only the CPU is
# measured. Items starting past BUDGET seconds (125) are skipped, in that order.
#   OUT=folder bash benchmarks/cpu_engine_device.sh  -> $OUT/cpu_engine.log, $OUT/cpu_engine.json
set -uo pipefail
OUT=${OUT:-/tmp/cpu_engine}; mkdir -p "$OUT"; tmp=$(mktemp -d)
export PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
PY=${PY:-python3}; log=$OUT/cpu_engine.log
say() { echo "== $* ($(date +%T), load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"; }
late() { [ "$SECONDS" -gt "${BUDGET:-125}" ] && say "skipped (past ${BUDGET:-125} s): $*"; }
bench() {  # name, pin, threads, bench options...
  local name=$1 pin=$2 t=$3; shift 3
  late "$name" && return
  say "$name: ${pin:-no pin}, SMALLEM_THREADS=OMP_NUM_THREADS=$t, smallem bench $*"
  SMALLEM_THREADS=$t OMP_NUM_THREADS=$t timeout 60 $pin $PY -m smallem bench "$@" \
    --json "$tmp/$name.json" 2>&1 | grep -v "^timing" | tee -a "$log"
}
alone() {  # smallem's Transformer row alone in a process: SMALLEM_THREADS=$1 (default: unset)
  late "alone $1" && return
  say "smallem cpu alone, SMALLEM_THREADS=$1"
  ( [ "$1" = default ] || export SMALLEM_THREADS=$1
    timeout 40 $PY benchmarks/cpu_step.py alone "smallem cpu" 16 ) 2>&1 | tee -a "$log"
}
say "host: $(nproc) CPUs, $(lscpu | grep -E '^(Thread|Core|Socket|Model name)' | tr -s ' ' | tr '\n' ';')"
$PY -c "import numpy, torch, sys; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__)" | tee -a "$log"
T="--model transformer --steps 160 --block 10 --warmup 3"  # CPU plan: 3 warm-up, 16 blocks of 1 step
bench transformer_16t "" 16 $T
bench transformer_2t "taskset -c 0,1" 2 $T
bench transformer_1t "taskset -c 0" 1 $T
M="--steps 200 --block 20 --warmup 20 --no-cpu64"
bench mlp_16t "" 16 $M
bench mlp_2t "taskset -c 0,1" 2 $M
alone default  # the thread policy's own choice on this host
late ops || { say "smallem's step by operation, 16 threads"
  SMALLEM_THREADS=16 timeout 30 $PY benchmarks/cpu_step.py ops 8 2>&1 | tee -a "$log"; }
late routes || { say "the two routes: NumPy on the team against numba prange"
  timeout 30 $PY benchmarks/cpu_routes.py 16 2>&1 | tee -a "$log"; }
alone 8
$PY - "$tmp" "$OUT/cpu_engine.json" <<'PYEOF'
import json, pathlib, sys
runs = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(runs, indent=1))
PYEOF
say done

#!/usr/bin/env bash
# The float32 CPU engine (issue 38) on a many-core host, GPU hidden. First the small Transformer's
# CPU rows each alone in a process of its own (bench._time_row through cpu_step.py alone: one JSON
# line per row as it ends) at 16 threads, on 2 pinned cores, on 1, and under the default thread
# policy; then `smallem bench`'s tables (MLP at 16 and 2, Transformer at 16; each row alone, two
# rounds, every round logged as it ends), the two routes (cpu_routes.py) and the step by operation.
# Anything starting past BUDGET seconds (default 250) is skipped, in that order.
#   OUT=folder bash benchmarks/cpu_engine_device.sh  -> $OUT/cpu_engine.log, $OUT/cpu_engine.json
# Round 6's first call gave each bench 60 s, which both Transformer tables outran (no rows): a row's
# process costs ~5 s before its first step (Python, torch's import), a table 6 of them.
set -uo pipefail
OUT=${OUT:-/tmp/cpu_engine}; mkdir -p "$OUT"; tmp=$(mktemp -d)
export PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
PY=${PY:-python3}; log=$OUT/cpu_engine.log; rows=$OUT/cpu_engine_rows.jsonl
say() { echo "== $* ($(date +%T), ${SECONDS}s, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"; }
late() { [ "$SECONDS" -gt "${BUDGET:-250}" ] && say "skipped (past ${BUDGET:-250} s): $*"; }
alone() {  # threads (or default: SMALLEM_THREADS unset), pin, row
  late "alone $*" && return
  local t=$1 pin=$2 row=$3
  ( if [ "$t" != default ]; then export SMALLEM_THREADS=$t OMP_NUM_THREADS=$t; fi
    timeout 60 $pin $PY benchmarks/cpu_step.py alone "$row" 16 ) 2>>"$log" | sed "s/^{/{\"asked\": \"$t ${pin:-no pin}\", /" \
    | tee -a "$rows" "$log"
}
bench() {  # name, pin, threads, bench options...
  local name=$1 pin=$2 t=$3; shift 3
  late "$name" && return
  say "$name: ${pin:-no pin}, SMALLEM_THREADS=OMP_NUM_THREADS=$t, smallem bench $*"
  SMALLEM_THREADS=$t OMP_NUM_THREADS=$t timeout 150 $pin $PY -m smallem bench "$@" \
    --json "$tmp/$name.json" 2>&1 | tee -a "$log"
}
say "host: $(nproc) CPUs, $(lscpu | grep -E '^(Thread|Core|Socket|Model name)' | tr -s ' ' | tr '\n' ';')"
$PY -c "import numpy, torch, sys; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__)" | tee -a "$log"
for setting in "16|" "2|taskset -c 0,1" "1|taskset -c 0"; do
  say "Transformer rows alone: ${setting%%|*} threads, ${setting#*|}"
  for row in "smallem cpu" "PyTorch eager" "PyTorch eager, SDPA"; do alone "${setting%%|*}" "${setting#*|}" "$row"; done
done
say "smallem's row under the default policy"; alone default "" "smallem cpu"
M="--steps 200 --block 20 --warmup 20 --no-cpu64"
bench mlp_16t "" 16 $M
bench mlp_2t "taskset -c 0,1" 2 $M
bench transformer_16t "" 16 --model transformer --steps 160 --block 10 --warmup 3
late routes || { say "the two routes: NumPy on the team against numba prange"
  timeout 40 $PY benchmarks/cpu_routes.py 16 2>&1 | tee -a "$log"; }
late ops || { say "smallem's step by operation, 16 threads"
  SMALLEM_THREADS=16 timeout 30 $PY benchmarks/cpu_step.py ops 8 2>&1 | tee -a "$log"; }
$PY - "$tmp" "$OUT/cpu_engine.json" <<'PYEOF'
import json, pathlib, sys
runs = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(runs, indent=1))
PYEOF
say done

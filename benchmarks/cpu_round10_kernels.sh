#!/usr/bin/env bash
# Round 10 (issue 38) on the device host's CPU (GPU hidden), one call: the compiled kernels against
# their NumPy routes on one thread (cpu_kernels.py), then bench's transformer row each alone in
# its process, this branch (.) beside its base (BASE, another tree) and PyTorch's rows, at 16
# threads, 2 pinned cores and 1 pinned core (compare within a thread count: the host's speed moves
# between minutes; VARIANT, a third tree, at 16 and 2), then the MLP's rows by `smallem bench
# --model mlp` at the same three counts (each row alone in its process there), then the branch's
# step by operation on one pinned core and on 16 threads.
# Anything starting past BUDGET seconds (default 150) is skipped; ROWS_AT, MLP_AT and OPS_AT
# choose the thread counts (THREADS:PIN words, e.g. "16: 1:0"; empty: none); KERNELS=0 skips the
# kernels' micro-bench.
#   OUT=folder BASE=../r10-base [VARIANT=../r10-v] bash benchmarks/cpu_round10_kernels.sh
#   -> $OUT/cpu_round10.log, .jsonl, kernels.json, mlp_{16,2,1}.json, ops_{1,16}.json
set -uo pipefail
OUT=${OUT:-/tmp/cpu_round10}; mkdir -p "$OUT"; BASE=${BASE:-}; VARIANT=${VARIANT:-}
export CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
PY=${PY:-python3}; log=$OUT/cpu_round10.log; rows=$OUT/cpu_round10.jsonl; STEPS=${STEPS:-12}; HERE=$PWD
say() { echo "== $* ($(date +%T), ${SECONDS}s, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"; }
late() { [ "$SECONDS" -gt "${BUDGET:-150}" ] && say "skipped (past ${BUDGET:-150} s): $*"; }
tag() { sed "s/^{/{\"asked\": \"$1\", /" | tee -a "$rows" "$log"; }
alone() {  # alone TREE THREADS PIN NAME: one bench row alone in its process, TREE's code
  local tree=$1 t=$2 pin=$3 name=$4 label=branch
  [ "$tree" = "$BASE" ] && label=base
  [ "$tree" = "$VARIANT" ] && label=variant
  late "$name $label $t ${pin:-unpinned}" && return
  (cd "$tree" && env PYTHONPATH="$PWD" SMALLEM_THREADS="$t" OMP_NUM_THREADS="$t" timeout 40 \
    ${pin:+taskset -c $pin} $PY benchmarks/cpu_step.py alone "$name" "$STEPS" 2>>"$log") \
    | tag "$name, $label, $t threads, ${pin:-unpinned}"
}
say "host: $(nproc) CPUs, $(lscpu | grep -m1 'Model name' | cut -d: -f2 | xargs);" \
  "$($PY -c 'import numba, numpy; print("numba", numba.__version__, "numpy", numpy.__version__)')"
if [ "${KERNELS:-1}" = 1 ]; then  # KERNELS=0: no micro-bench (round 10's last call)
  say "kernels, one thread, core 0"
  PYTHONPATH=$HERE SMALLEM_THREADS=1 OMP_NUM_THREADS=1 timeout 60 taskset -c 0 \
    $PY benchmarks/cpu_kernels.py 15 2>>"$log" | tee "$OUT/kernels.json" >>"$log"
fi
for spec in ${ROWS_AT-16: 2:0,1 1:0}; do  # THREADS:PIN (none: unpinned)
  t=${spec%%:*}; pin=${spec#*:}
  say "transformer rows alone: $t threads ${pin:-unpinned}"
  alone "$HERE" "$t" "$pin" "smallem cpu"
  [ -n "$BASE" ] && alone "$BASE" "$t" "$pin" "smallem cpu"
  [ -n "$VARIANT" ] && [ "$t" != 1 ] && alone "$VARIANT" "$t" "$pin" "smallem cpu"
  alone "$HERE" "$t" "$pin" "PyTorch eager, SDPA"
  [ "$t" = 1 ] || alone "$HERE" "$t" "$pin" "PyTorch eager"
done
for spec in ${MLP_AT-16: 2:0,1 1:0}; do
  t=${spec%%:*}; pin=${spec#*:}
  late "mlp $t" && continue
  say "mlp: smallem bench --model mlp, $t threads ${pin:-unpinned}"
  PYTHONPATH=$HERE OMP_NUM_THREADS=$t timeout 60 ${pin:+taskset -c $pin} $PY -m smallem bench \
    --model mlp --no-cpu64 --steps 60 --warmup 10 --block 10 --threads "$t" \
    --json "$OUT/mlp_$t.json" >>"$log" 2>&1
done
for spec in ${OPS_AT-1:0 16:}; do
  t=${spec%%:*}; pin=${spec#*:}
  late "ops $t" && continue
  say "ops $t ${pin:-unpinned}"
  PYTHONPATH=$HERE SMALLEM_THREADS=$t OMP_NUM_THREADS=$t timeout 40 ${pin:+taskset -c $pin} \
    $PY benchmarks/cpu_step.py ops 8 2>>"$log" | tee "$OUT/ops_$t.json" >>"$log"
done
say done

#!/usr/bin/env bash
# Issue 38, round 11 (branch r11-cpu16), on the device host's CPU (GPU hidden).
# PART=1 (locate): benchmarks/r11-cpu16_locate.py conc (one-thread GEMMs side by side: NumPy's
#   matmul, NumPy's OpenBLAS from a compiled loop, a numba GEMM of our own), perf stat/record of
#   the compiled OpenBLAS loop at 16 threads where perf exists, the team's empty runs, the step by
#   operation at 1 (pinned), 4 and 16 threads.
# PART=2 (rows): bench's transformer row each alone in its process, this tree against BASE (main's
#   tree) interleaved, PyTorch SDPA beside, at 16 threads, 2 pinned cores, 1 pinned; the step by op.
# PART=2 with HERE_ENV, ALT_ENV, ONLY16 (round 11's second step, r11-cpu16b): see PART=2 below.
# PART=3 (round 13): REPS rounds, each: at 16 threads, 2 pinned cores (PINS) and 1 (PINS' first),
#   this tree, BASE and PyTorch SDPA (and eager unless NO_EAGER) each alone, and this tree under
#   each variant of ALT16_ENV / ALT2_ENV / ALT1_ENV (variants split by ";", each a list of VAR=value);
#   first both trees' numba caches built side by side (not timed); after the first round the step by
#   op at 16 (and 1 unless NO_OPS1), PyTorch's by op (`cpu_step.py torch-ops`) at 16 and 1 (none
#   with NO_OPS; OPS_RUNS, e.g. "smallem 16;smallem 1", picks which: round 14). CONFIGS: the
#   thread counts of the rows (default "16 2 1"). ATTN: thread counts at which the attention alone is timed first (r13_cpu_attention.py, ATTN_REPS times (2), cores 0..N-1 pinned
#   below 16), this tree as it is and under each variant of ATTN_ENV. LINEAR (round 15): thread
#   counts at which r14_cpu_linear.py times the step's five Linears first (cores 0..N-1 pinned below 16).
# ONES (round 16): the cores the one-core rows run on, each in turn (default: PINS' first), e.g. "0 2".
# Anything starting past BUDGET seconds is skipped.   OUT=folder PART=1 bash benchmarks/r11-cpu16_device.sh
set -uo pipefail
OUT=${OUT:-/tmp/r11-cpu16}; mkdir -p "$OUT/logs"
export CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
PY=${PY:-python3}; log=$OUT/logs/cpu16.log; rows=$OUT/logs/rows.jsonl; STEPS=${STEPS:-12}
HERE=$PWD; BASE=${BASE:-}
say() { echo "== $* ($(date +%T), ${SECONDS}s, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"; }
late() { [ "$SECONDS" -gt "${BUDGET:-100}" ] && { say "skipped: $*"; return 0; }; return 1; }
say "host: $(nproc) CPUs, $(lscpu | grep -m1 'Model name' | tr -s ' '), $(lscpu | grep -E -m2 'Core|Thread' | tr -s ' ' | tr '\n' ' ')"
PYTHONPATH=$HERE $PY -c 'import numba, numpy, torch; from threadpoolctl import threadpool_info as t; from smallem.backends.cpu import compiled; print("numba", numba.__version__, "numpy", numpy.__version__, "torch", torch.__version__, "compiled Linear:", bool(compiled.linear())); print([(i["internal_api"], i.get("version"), i.get("architecture"), i["num_threads"]) for i in t()])' 2>&1 | tee -a "$log"
if [ "${PART:-1}" = 1 ]; then
  export PYTHONPATH=$HERE
  say "conc: one-thread GEMMs side by side"
  timeout 80 $PY benchmarks/r11-cpu16_locate.py conc 1 4 8 16 2>>"$log" | tee -a "$OUT/logs/conc.jsonl" "$log"
  if command -v perf >/dev/null; then
    say "perf stat, openblas loop and own gemm loop, 16 threads, 256x64 @ 64x64"
    for r in 1 2; do timeout 30 perf stat -e task-clock,context-switches,cpu-migrations,page-faults,cycles,instructions,cache-misses \
      $PY benchmarks/r11-cpu16_locate.py one $r 16 256 64 >>"$log" 2>&1; done
    say "perf record, openblas loop, 16 threads"
    timeout 40 perf record -g -o /tmp/perf.data $PY benchmarks/r11-cpu16_locate.py one 1 16 256 64 >>"$log" 2>&1
    timeout 40 perf report -i /tmp/perf.data --stdio --no-children --sort dso,sym -g none --percent-limit 0.3 2>/dev/null | grep -v '^$' | head -120 > "$OUT/logs/perf_report.txt"
    head -60 "$OUT/logs/perf_report.txt" | tee -a "$log" >/dev/null
  else
    say "no perf on the host"
  fi
  late empty || { say "empty runs"; timeout 60 $PY benchmarks/r11-cpu16_locate.py empty 1 2 4 8 16 2>>"$log" | tee -a "$OUT/logs/empty.jsonl" "$log"; }
  if command -v perf >/dev/null && ! late "perf of the step"; then
    say "perf record of the step, 16 threads (bench's row alone)"
    SMALLEM_THREADS=16 OMP_NUM_THREADS=16 timeout 40 perf record -g -o /tmp/step.data $PY benchmarks/cpu_step.py alone "smallem cpu" 24 >>"$log" 2>&1
    timeout 40 perf report -i /tmp/step.data --stdio --no-children --sort dso,sym -g none --percent-limit 0.3 2>/dev/null | grep -v '^$' | head -150 > "$OUT/logs/perf_step.txt"
    timeout 40 perf report -i /tmp/step.data --stdio --no-children --sort dso -g none 2>/dev/null | grep -v '^$' | head -40 >> "$OUT/logs/perf_step.txt"
  fi
  # the step by operation: this tree at 16 threads, BASE's (main's tree) at 16, BASE's without
  # its pool (SMALLEM_POOL=0: helpers asleep on their queues), this tree on 1 pinned core and on 4
  for run in "$HERE 16" "$BASE 16" "$BASE 16 0" "$HERE 1" "$HERE 4"; do
    set -- $run; tree=$1 t=$2 pool=${3:-}
    [ -z "$tree" ] && continue
    late "ops $run" && continue
    say "ops, $run"
    pin=""; [ "$t" = 1 ] && pin="taskset -c 0"
    (cd "$tree" && PYTHONPATH=$PWD SMALLEM_POOL=$pool SMALLEM_THREADS=$t OMP_NUM_THREADS=$t timeout 40 $pin $PY \
      benchmarks/cpu_step.py ops 8 2>>"$log") | sed "s|^{|{\"asked\": \"ops, $t threads, $(basename "$tree"), pool '$pool'\", |" \
      | tee -a "$OUT/logs/ops.jsonl" "$log"
  done
fi
if [ "${PART:-1}" = 2 ]; then
  alone() {  # alone TREE THREADS PIN NAME [extra env...]
    late "$*" && return
    local tree=$1 t=$2 pin=$3 name=$4; shift 4
    (cd "$tree" && env PYTHONPATH="$PWD" SMALLEM_THREADS="$t" OMP_NUM_THREADS="$t" "$@" timeout 40 \
      ${pin:+taskset -c $pin} $PY benchmarks/cpu_step.py alone "$name" "$STEPS" 2>>"$log") \
      | sed "s|^{|{\"asked\": \"$name, $t threads, ${pin:-unpinned}, $(basename "$tree") $*\", |" | tee -a "$rows" "$log"
  }
  # HERE_ENV: extra env for this tree's rows and ops (e.g. SMALLEM_POOL_JOBS=1); ALT_ENV: this
  # tree's second variant (default: the pool's grain 8); ONLY16=1: the 16-thread rows alone
  alone "$HERE" 16 "" "smallem cpu" ${HERE_ENV:-}
  alone "$BASE" 16 "" "smallem cpu"
  alone "$HERE" 16 "" "PyTorch eager, SDPA"
  alone "$HERE" 16 "" "smallem cpu" ${ALT_ENV:-SMALLEM_POOL_GRAIN=8}
  if [ -z "${ONLY16:-}" ]; then
    alone "$HERE" 2 0,1 "smallem cpu"
    alone "$BASE" 2 0,1 "smallem cpu"
    alone "$HERE" 2 0,1 "PyTorch eager, SDPA"
  fi
  alone "$HERE" 16 "" "smallem cpu" ${HERE_ENV:-}
  alone "$BASE" 16 "" "smallem cpu"
  if [ -z "${ONLY16:-}" ]; then
    alone "$HERE" 2 0,1 "smallem cpu" SMALLEM_POOL=1
    alone "$HERE" 1 0 "smallem cpu"
    alone "$BASE" 1 0 "smallem cpu"
    alone "$HERE" 1 0 "PyTorch eager, SDPA"
  fi
  alone "$HERE" 16 "" "smallem cpu" ${ALT_ENV:-SMALLEM_POOL_GRAIN=8}
  [ -n "${ONLY16:-}" ] && alone "$HERE" 16 "" "smallem cpu" ${HERE_ENV:-}
  for ops in "${HERE_ENV:-}" ${ONLY16:+"${ALT_ENV:-}"}; do
    late "ops 16 $ops" || { say "ops, 16 threads $ops"; env $ops SMALLEM_THREADS=16 OMP_NUM_THREADS=16 PYTHONPATH=$HERE timeout 30 $PY benchmarks/cpu_step.py ops 8 \
      2>>"$log" | sed "s/^{/{\"asked\": \"ops, 16 threads $ops\", /" | tee -a "$OUT/logs/ops.jsonl" "$log"; }
  done
fi
if [ "${PART:-1}" = 3 ]; then
  alone() {  # alone TREE THREADS PIN NAME [extra env...]
    late "$*" && return
    local tree=$1 t=$2 pin=$3 name=$4; shift 4
    (cd "$tree" && env PYTHONPATH="$PWD" SMALLEM_THREADS="$t" OMP_NUM_THREADS="$t" "$@" timeout 40 \
      ${pin:+taskset -c $pin} $PY benchmarks/cpu_step.py alone "$name" "$STEPS" 2>>"$log") \
      | sed "s|^{|{\"asked\": \"$name, $t threads, ${pin:-unpinned}, $(basename "$tree") $*\", |" | tee -a "$rows" "$log"
  }
  say "numba caches, both trees side by side (not timed)"
  for tree in "$HERE" "$BASE"; do
    [ -n "$tree" ] && (cd "$tree" && PYTHONPATH=$PWD SMALLEM_THREADS=16 OMP_NUM_THREADS=16 timeout 90 \
      $PY benchmarks/cpu_step.py alone "smallem cpu" 2 >/dev/null 2>>"$log") &
  done
  wait
  byop() {  # the step by op, smallem's and PyTorch's (after the first round: the rows' budget)
    IFS=';' read -ra opruns <<< "${OPS_RUNS:-smallem 16;torch 16;smallem 1;torch 1}"
    for run in "${opruns[@]}"; do
      set -- $run; what=$1 t=$2
      [ "$t" = 1 ] && [ -n "${NO_OPS1:-}" ] && [ "$what" = smallem ] && continue
      late "ops $run" && continue
      say "ops, $run"
      pin=""; [ "$t" = 1 ] && pin="taskset -c $ONE"
      sub=ops; [ "$what" = torch ] && sub=torch-ops
      SMALLEM_THREADS=$t OMP_NUM_THREADS=$t PYTHONPATH=$HERE timeout 40 $pin $PY benchmarks/cpu_step.py $sub 8 \
        2>>"$log" | sed "s/^{/{\"asked\": \"$sub, $t threads\", /" | tee -a "$OUT/logs/ops.jsonl" "$log"
    done
  }
  PINS=${PINS:-0,1}; ONE=${PINS%%,*}
  IFS=';' read -ra avars <<< ";${ATTN_ENV:-}"
  for rep in $(seq "${ATTN_REPS:-2}"); do
    for t in ${ATTN:-}; do
      for alt in "${avars[@]}"; do
        late "attention $t $alt" && continue
        pin=""; [ "$t" -lt 16 ] && pin="taskset -c 0-$((t - 1))"
        env $alt PYTHONPATH=$HERE OMP_NUM_THREADS=$t timeout 30 $pin $PY benchmarks/r13_cpu_attention.py "$t" \
          2>>"$log" | sed "s/^{/{\"asked\": \"attention, $t threads $alt\", /" | tee -a "$OUT/logs/attention.jsonl" "$log"
      done
    done
  done
  for t in ${LINEAR:-}; do
    late "linear $t" && continue
    say "linear, $t threads"
    pin=""; [ "$t" -lt 16 ] && pin="taskset -c 0-$((t - 1))"
    PYTHONPATH=$HERE OMP_NUM_THREADS=$t timeout 60 $pin $PY benchmarks/r14_cpu_linear.py "$t" \
      2>>"$log" | tee -a "$OUT/logs/linear$t.jsonl" "$log"
  done
  for rep in $(seq "${REPS:-1}"); do
    say "round $rep"
    for t in ${CONFIGS:-16 2 1}; do
      pins=""; [ "$t" = 2 ] && pins=$PINS; [ "$t" = 1 ] && pins=${ONES:-$ONE}
      for pin in ${pins:-unpinned}; do  # ONES (round 16): each one-core row on each of these cores
        [ "$pin" = unpinned ] && pin=""
        alone "$HERE" "$t" "$pin" "smallem cpu"
        [ -n "$BASE" ] && alone "$BASE" "$t" "$pin" "smallem cpu"
        alone "$HERE" "$t" "$pin" "PyTorch eager, SDPA"
        [ -z "${NO_EAGER:-}" ] && alone "$HERE" "$t" "$pin" "PyTorch eager"
        var="ALT${t}_ENV"; IFS=';' read -ra alts <<< "${!var:-}"
        for alt in "${alts[@]}"; do [ -n "$alt" ] && alone "$HERE" "$t" "$pin" "smallem cpu" $alt; done
      done
    done
    [ "$rep" = 1 ] && [ -z "${NO_OPS:-}" ] && byop
  done
fi
say done
tar -C "$OUT" -czf "$OUT/cpu16_part${PART:-1}.tgz" logs && rm -rf "$OUT/logs"

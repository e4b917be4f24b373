#!/usr/bin/env bash
# Round 7 (issue 38): why the float32 CPU step does not scale, on a many-core host (GPU hidden).
# 1. team.run's own cost by team size (cpu_scaling.py overhead);
# 2. the settings side by side in one process (cpu_scaling.py sweep: GRAIN, fused attention, the
#    GIL's switch interval) at N (16) threads, on 2 pinned cores, on 1 (round 7 ran it at commit
#    68d3c97, with BLAS's threads and a tree wake-up too: cpu_scaling_device.log);
# 3. bench's rows each alone in a process (cpu_step.py alone) with the best fused setting of step
#    2 at that thread count: smallem and PyTorch SDPA / eager at N, 2 pinned and 1 pinned
#    thread(s), smallem under the default policy; 4. the step by operation at N; 5. the MLP at N.
# Anything starting past BUDGET seconds (default 180) is skipped, in that order.
#   OUT=folder BUDGET=180 bash benchmarks/cpu_scaling_device.sh -> $OUT/cpu_scaling.log, .jsonl
set -uo pipefail
OUT=${OUT:-/tmp/cpu_scaling}; mkdir -p "$OUT"
export PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
PY=${PY:-python3}; log=$OUT/cpu_scaling.log; rows=$OUT/cpu_scaling.jsonl
N=${N:-16}; ROUNDS=${ROUNDS:-10}; STEPS=${STEPS:-16}; export SWEEP_SECONDS=${SWEEP_SECONDS:-25}
say() { echo "== $* ($(date +%T), ${SECONDS}s, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"; }
late() { [ "$SECONDS" -gt "${BUDGET:-180}" ] && say "skipped (past ${BUDGET:-180} s): $*"; }
tag() { sed "s/^{/{\"asked\": \"$1\", /" | tee -a "$rows" "$log"; }
best() {  # GRAIN of the fastest fused setting in the sweep at $1 threads (its JSON line in $rows)
  $PY - "$rows" "$1" <<'PYEOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
sweep = ([l for l in lines if l.get("asked") == f"sweep {sys.argv[2]}"] or [{}])[-1]
times = {k: v for k, v in sweep.items() if k.startswith("grain") and ", fused" in k and "switch" not in k}
print(min(times, key=times.get).split(",")[0].split()[1] if times else 8)
PYEOF
}
say "host: $(nproc) CPUs, $(lscpu | grep -E '^(Thread|Core|Socket|Model name)' | tr -s ' ' | tr '\n' ';')"
$PY -c "import numpy, sys; print('python', sys.version.split()[0], 'numpy', numpy.__version__)" | tee -a "$log"
grep -o -w -E 'avx512f|avx2|fma|avx512_bf16|amx_tile' /proc/cpuinfo | sort | uniq -c | tr '\n' ' ' | tee -a "$log"; echo | tee -a "$log"
say "one thread's GEMMs: OpenBLAS's own choice of kernels, then forced to SkylakeX and to Haswell"
timeout 20 $PY benchmarks/cpu_scaling.py gemm 2>>"$log" | tag "gemm default"
for core in SkylakeX Haswell; do
  OPENBLAS_CORETYPE=$core timeout 20 $PY benchmarks/cpu_scaling.py gemm 2>>"$log" | tag "gemm $core"
done
forced=$($PY - "$rows" <<'PYEOF'
import json, sys  # SkylakeX's kernels forced, when they beat OpenBLAS's own choice by 30 % or more
rows = {r["asked"]: r for r in map(json.loads, open(sys.argv[1])) if r["asked"].startswith("gemm")}
own, sky = rows.get("gemm default", {}), rows.get("gemm SkylakeX", {})
key = "4096x64x256 ms"
print("SkylakeX" if key in own and key in sky and own["openblas"] != "SkylakeX" and own[key] > 1.3 * sky[key] else "")
PYEOF
)
say "OpenBLAS's kernels forced for an extra row each: ${forced:-none}"
say "team.run's cost, µs a run of 16 pieces"
SMALLEM_THREADS=1 OMP_NUM_THREADS=1 timeout 30 $PY benchmarks/cpu_scaling.py overhead 2>>"$log" | tag "overhead"
for setting in "$N|" "2|taskset -c 0,1" "1|taskset -c 0"; do
  t=${setting%%|*}; pin=${setting#*|}
  late "sweep $t" && continue
  say "settings side by side: $t threads ${pin:-no pin}"
  if [ "$t" = 1 ]; then names=("grain 1, unfused (round 6)" "grain 1, fused"); else names=(); fi
  SMALLEM_THREADS=$t OMP_NUM_THREADS=$t timeout 60 $pin $PY benchmarks/cpu_scaling.py sweep "$ROUNDS" \
    "${names[@]}" 2>>"$log" | tag "sweep $t"
done
for setting in "$N|" "2|taskset -c 0,1" "1|taskset -c 0"; do
  t=${setting%%|*}; pin=${setting#*|}; g=$(best "$t")
  say "rows alone: $t threads ${pin:-no pin}, GRAIN $g"
  for row in "smallem cpu" "PyTorch eager, SDPA" "PyTorch eager" ${forced:+"forced"}; do
    late "alone $t $row" && continue
    core=(); name=$row; what="alone $t, grain $g"
    if [ "$row" = forced ]; then core=("OPENBLAS_CORETYPE=$forced"); name="smallem cpu"; what="$what, $forced"; fi
    env "${core[@]}" SMALLEM_GRAIN=$g SMALLEM_THREADS=$t OMP_NUM_THREADS=$t \
      timeout 40 $pin $PY benchmarks/cpu_step.py alone "$name" "$STEPS" 2>>"$log" | tag "$what"
  done
done
g=$(best "$N")
export SMALLEM_GRAIN=$g
late "default" || { say "smallem under the default policy, GRAIN $g"
  timeout 40 $PY benchmarks/cpu_step.py alone "smallem cpu" "$STEPS" 2>>"$log" | tag "alone default, grain $g"; }
late "ops" || { say "the step by operation, $N threads, GRAIN $g"
  SMALLEM_THREADS=$N OMP_NUM_THREADS=$N timeout 30 $PY benchmarks/cpu_step.py ops 8 2>>"$log" | tag "ops $N, grain $g"; }
late "mlp" || { say "the MLP's table, $N threads, GRAIN $g"
  SMALLEM_THREADS=$N OMP_NUM_THREADS=$N timeout 60 $PY -m smallem bench --steps 200 --block 20 \
    --warmup 20 --no-cpu64 --json "$OUT/mlp_${N}t.json" 2>&1 | tee -a "$log"; }
say done

#!/usr/bin/env bash
# Round 10's second last call: the attention switches' tests again (the first call's cubins fell
# back to a plain-sm_90 NVRTC compile for configurations they lacked, whose wgmma forward trapped
# and took the CUDA context down: cubins.install now falls back to sm_90a), then the host CPU's
# Transformer rows interleaved, merged main (.) and round 9's tree (BASE) in turn, each alone in
# its process: the first call ran them once each and the host moves ~30 % between minutes.
#   OUT=DIR CUBINS=DIR BASE=DIR bash benchmarks/round10_final2.sh  -> DIR/round10_final2.tar.gz
set -uo pipefail
OUT=${OUT:-/tmp/r10f2}; W=$OUT/w; mkdir -p "$W"; HERE=$PWD
export PYTHONUNBUFFERED=1; PY=${PY:-python3}
SWITCHES="each_way_of_adding_dq or round_10_switches or tiled_key_kernel or each_tensor_core_version"
echo "=== switches ($(date +%T))"
PYTHONPATH=$HERE:$HERE/benchmarks timeout ${SWITCHES_S:-80} $PY -c "
import os, sys, pytest, cubins
cubins.install(os.environ['CUBINS'])
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-rs', '-x', '-k', sys.argv[1],
                      'tests/test_attention_fused_gpu.py']))" "$SWITCHES" > "$W/switches.log" 2>&1
grep -E "^(ERROR|FAILED)|passed|failed" "$W/switches.log" | tail -6
tar -C "$W" -czf "$OUT/round10_final2.tar.gz" .
row() {  # TREE THREADS PIN POOL NAME LABEL: one row alone in its process
  [ "$SECONDS" -gt "${BUDGET:-150}" ] && { echo "skipped: $6"; return; }
  (cd "$1" && env PYTHONPATH="$PWD" CUDA_VISIBLE_DEVICES= SMALLEM_THREADS="$2" OMP_NUM_THREADS="$2" \
    ${4:+SMALLEM_POOL=$4} timeout 40 ${3:+taskset -c $3} $PY benchmarks/cpu_step.py alone "$5" 12 \
    2>>"$W/cpu.err") | sed "s/^{/{\"asked\": \"$6\", /" | tee -a "$W/cpu_rows.jsonl"
}
echo "=== cpu ($(date +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
for i in 1 2 3; do
  row "$HERE" 16 "" "" "smallem cpu" "main 16 ($i)"
  row "$BASE" 16 "" "" "smallem cpu" "round 9 16 ($i)"
  [ "$i" = 3 ] || row "$HERE" 16 "" 0 "smallem cpu" "main 16, pool off ($i)"
done
row "$HERE" 16 "" "" "PyTorch eager, SDPA" "PyTorch SDPA 16"
for i in 1 2; do
  row "$HERE" 1 0 "" "smallem cpu" "main 1 pinned ($i)"
  row "$BASE" 1 0 "" "smallem cpu" "round 9 1 pinned ($i)"
done
row "$HERE" 1 0 "" "PyTorch eager, SDPA" "PyTorch SDPA 1 pinned"
tar -C "$W" -czf "$OUT/round10_final2.tar.gz" .
echo "=== done ($(date +%T))"

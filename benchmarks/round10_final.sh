#!/usr/bin/env bash
# Round 10's last device call, on the merged main: the GPU tests as a user's run compiles them
# (NVRTC; SM90A "auto" takes sm_90a on the H200, so the wgmma forward runs), the configuration
# tests of the attention's switches from nvcc's cubins (benchmarks/cubins.py: NVRTC would take
# minutes over their ~100 modules), gradcheck in bf16 and fp16, the step in each precision at every
# size (README's tables), the attention rows at D 64 in float32 and bf16 (lesson 15, README, issue
# 37) with the 2-D tiled key kernel off and on in one process, D 128 in bf16, and the host CPU's
# rows (issue 38).
#   OUT=DIR [CUBINS=DIR] bash benchmarks/round10_final.sh [STAGE ...]
#   (stages: env tests switches gradcheck_low precision attention cpu)
#   -> DIR/round10_final.tar.gz, rewritten after every stage (a call cut short keeps what ran)
set -uo pipefail
OUT=${OUT:-/tmp/r10f}; W=$OUT/w; mkdir -p "$W"
export PYTHONPATH=$PWD:$PWD/benchmarks PYTHONUNBUFFERED=1
PY=${PY:-python3}
SWITCHES=${SWITCHES:-"each_way_of_adding_dq or round_10_switches or tiled_key_kernel or each_tensor_core_version"}
for stage in ${*:-env tests switches gradcheck_low precision attention cpu}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    env)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      if ls .whl/*.whl >/dev/null 2>&1; then  # the device image has no ipywidgets, nbformat
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
      fi ;;
    tests)  # every GPU / torch test but the switches' configurations, NVRTC as a user's run
      PYTHONPATH=$PYTHONPATH:/tmp/site timeout ${TESTS_S:-240} $PY -m pytest -o addopts= -p no:cacheprovider \
        -q -rs -m "gpu or torch" -k "not ($SWITCHES)" --continue-on-collection-errors tests/ \
        > "$W/pytest.log" 2>&1
      grep -E "^(ERROR|FAILED)|passed|failed" "$W/pytest.log" | tail -25 ;;
    switches)  # the attention switches' configurations against float64, from the cubins
      timeout ${SWITCHES_S:-90} $PY -c "
import os, sys, pytest, cubins
cubins.install(os.environ['CUBINS'])
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-rs', '-k', sys.argv[1],
                      'tests/test_attention_fused_gpu.py']))" "$SWITCHES" > "$W/switches.log" 2>&1
      grep -E "^(ERROR|FAILED)|passed|failed" "$W/switches.log" | tail -12 ;;
    gradcheck_low) OUT=$W bash benchmarks/gpu_session.sh gradcheck_low 2>&1 | tail -4 ;;
    precision) OUT=$W timeout ${PRECISION_S:-200} bash benchmarks/gpu_session.sh precision 2>&1 | tail -22 ;;
    attention)  # D 64 fp32 + bf16 with the defaults (tiled on), then bf16 with tiled off; D 128 bf16
      timeout ${ATTENTION_S:-120} $PY -c "
import json, sys
from smallem.tools import bench_attention as b
from smallem.tools.bench import machine
from smallem.backends.cuda import attention_mma
b.REPS = 10
out = {'device': 'gpu', 'machine': machine(), 'sm90a': str(attention_mma.sm90a())}
def save(): json.dump(out, open(sys.argv[1], 'w'), indent=1)
out['attention'] = b.attention_rows('gpu', True, print, (64,), (1024, 2048, 4096), ('fp32', 'bf16')); save()
attention_mma.CONFIG['tiled'][64] = 0
print('=== bf16, keyq not tiled (round 9)', flush=True)
out['not_tiled'] = b.attention_rows('gpu', True, print, (64,), (1024, 2048, 4096), ('bf16',)); save()
attention_mma.CONFIG['tiled'][64] = 1
out['d128'] = b.attention_rows('gpu', True, print, (128,), (1024,), ('bf16',)); save()" \
        "$W/attention_h200.json" 2>&1 | tee "$W/attention.log" | grep -v "^=== done" ;;
    cpu)  # the host CPU's Transformer and MLP rows, each alone (issue 38; BASE: round 9's tree beside)
      OUT=$W/cpu timeout ${CPU_S:-120} bash benchmarks/cpu_round10_kernels.sh 2>&1 | tail -30 ;;
  esac
  tar -C "$W" -czf "$OUT/round10_final.tar.gz" .
done
echo "=== done ($(date +%T))"

#!/usr/bin/env bash
# Issue 37's device calls (round 9): the attention GPU tests (copies only where read, the bf16
# step's census), the variants timed apart against PyTorch's SDPA (attention_round9_variants.py),
# `smallem bench --attention`'s rows (D 64; D 128 and fp16), the bf16 step at 2 x 512 and 8 x 512
# against PyTorch's bf16 (issue 36's ratio with these kernels), an ncu profile of the kernels.
#   OUT=DIR bash benchmarks/attention_round9.sh [STAGE ...]   -> DIR/attention_round9_CALL.tar.gz
# (stages: tests variants bench64 bench128 step ncu, round 9b's bench64both ncuboth; each under its
# own time limit). The tensor-core attention's modules come as cubins compiled here
# (benchmarks/cubins.py, nvcc 13.0 -arch=sm_90a, the same source text) where CUBINS names their
# folder: NVRTC took a minute a call.
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
W=$OUT/w
mkdir -p "$W"
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
CALL=${CALL:-1}
PRE="import os, sys
if os.environ.get('CUBINS'):
    import cubins; cubins.install(os.environ['CUBINS'])
if os.environ.get('TILED'):  # round 9b: keyq by the 2-D tiling at D 64 (attention_mma_grad2d.py)
    from smallem.backends.cuda import attention_mma; attention_mma.CONFIG['tiled'][64] = 1"
bench() {  # NAME WIDTHS LENGTHS PRECISIONS LIMIT: rows printed as they come, then NAME.json
  WIDTHS=$2 LENGTHS=$3 PRECISIONS=$4 timeout "$5" $PY -c "$PRE
import json
from smallem.tools import bench_attention as b
from smallem.tools.bench import machine
env = lambda n: tuple(int(x) for x in os.environ[n].split())
b.REPS = 10
rows = b.attention_rows('gpu', True, print, env('WIDTHS'), env('LENGTHS'), tuple(os.environ['PRECISIONS'].split()))
json.dump({'device': 'gpu', 'attention': rows, 'machine': machine()}, open(sys.argv[1], 'w'), indent=1)" \
    "$W/$1.json" 2>&1 | tee "$W/$1.log"
}
for stage in ${*:-tests variants}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      timeout ${TESTS_S:-100} $PY -c "$PRE
import pytest
if os.environ.get('TESTS_K'):  # round 9b: a -k selection
    sys.argv += ['-k', os.environ['TESTS_K']]
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-rs', '-s',
                      'tests/test_attention_fused_gpu.py', 'tests/gpu/test_halves.py'] + sys.argv[1:]))" \
        2>&1 | tee "$W/attention_pytest$CALL.log" | grep -E "FAILED|ERROR|passed|failed|Error" | tail -20
      ;;
    variants)
      timeout ${VARIANTS_S:-70} $PY benchmarks/attention_round9_variants.py "$W/attention_variants$CALL.json" \
        2>&1 | tee "$W/attention_variants$CALL.log"
      ;;
    bench64)
      bench attention_bench_d64 64 "1024 2048 4096" "bf16" ${BENCH_S:-40}
      ;;
    bench64both)  # round 9b: the D 64 rows with today's keyq, then with the 2-D tiled one, one process
      timeout ${BENCH_S:-60} $PY -c "$PRE
import json
from smallem.tools import bench_attention as b
from smallem.tools.bench import machine
from smallem.backends.cuda import attention_mma
b.REPS = 10
out = {'device': 'gpu', 'machine': machine()}
for tiled in (0, 1):
    attention_mma.CONFIG['tiled'][64] = tiled
    print('=== keyq tiled' if tiled else '=== keyq as today', flush=True)
    out['tiled' if tiled else 'today'] = b.attention_rows('gpu', True, print, (64,), (1024, 2048, 4096), ('bf16',))
    json.dump(out, open(sys.argv[1], 'w'), indent=1)" "$W/attention_bench_d64b.json" 2>&1 | tee "$W/attention_bench_d64b.log"
      ;;
    ncuboth)  # round 9b: keyq alone under ncu, today's then the 2-D tiled, one process
      timeout ${NCU_S:-40} ncu --clock-control none --kernel-name "regex:flash_mma_keyq_bf16_64" -c 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis $PY -c "$PRE
from attention_variants import once
from smallem.backends.cuda import attention_mma
once('bf16', 4096, 64)
attention_mma.CONFIG['tiled'][64] = 1
once('bf16', 4096, 64)" > "$W/attention_ncu_keyq.txt" 2>&1
      grep -E "flash_|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Shared Memory Config" \
        "$W/attention_ncu_keyq.txt" | head -30
      ;;
    bench128)
      bench attention_bench_d128 128 "1024 4096" "bf16 fp16" 40
      ;;
    step)  # issue 36's grid points at head width 64, bf16 against PyTorch's bf16 (graph, SDPA)
      timeout ${STEP_S:-80} $PY -c "$PRE
from smallem.tools import bench_precision as bp
from smallem.data import load_corpus
tokens = load_corpus(None).train
print(bp.HEAD)
for size in ('2x512', '8x512'):
    bp.compare('transformer', size, bp.SIZES[size], ['bf16'], 64, tokens, (5, 40, 10), 0, print)" \
        2>&1 | tee "$W/step_bf16.log"
      ;;
    ncu)
      # (call 2 named flash_mma_.*: -c 4 counted the converts, keyq was not reached)
      timeout ${NCU_S:-60} ncu --clock-control none --kernel-name "regex:flash_mma_(forward|keyq)_bf16_64" -c 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        $PY -c "$PRE
from attention_variants import once; once('bf16', 4096, 64)" > "$W/attention_ncu.txt" 2>&1
      grep -E "flash_|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy" \
        "$W/attention_ncu.txt" | head -40
      ;;
  esac
  tar -C "$W" -czf "$OUT/attention_round9_$CALL.tar.gz" .
done
echo "=== done ($(date +%T))"

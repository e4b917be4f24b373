#!/usr/bin/env bash
# Issue 37's device call (round 10): the ways keyq adds dQ (CONFIG["dq"]: float2 atomics, v4
# reductions, bulk reduce-adds; today's keyq and the 2-D tiled one). Stages, each under its own limit:
#   tests     the attention GPU tests (test_attention_fused_gpu.py, gpu/test_halves.py: every way)
#   variants  attention_round10_variants.py: each variant checked against float64, then timed
#   bench     `smallem bench --attention`'s D 64 (BENCH_D) bf16 rows (captured) for each config of BENCH in
#             one process, PyTorch's SDPA rows (default = cuDNN, flash) beside the first
#   broken    the new GPU test against deliberately broken ways (it must fail there)
#   ncu       keyq alone at D 64, T 4,096 under ncu, for each config of NCU
#   step      the bf16 Transformer step at 8 x 512 beside PyTorch's bf16, for each config of STEP
#             ("best": the variants' fastest backward summed over T at D 64; needs variants' JSON)
#   OUT=DIR CUBINS=DIR bash benchmarks/attention_round10_backward.sh [STAGE ...]  -> DIR/attention_round10.tar.gz
# The tensor-core modules come as cubins compiled here (benchmarks/cubins.py, nvcc -arch=sm_90a).
# (Kept as round 10 ran it: round 11 removed CONFIG["dq"], dQ by its own pass and the test its
# broken stage names; attention_round10_variants.py keeps only today's keyq and the tiled one.)
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
W=$OUT/w
mkdir -p "$W"
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
BENCH=${BENCH:-today (float2 atomics);dq bulk;tiled, dq bulk;tiled}
NCU=${NCU:-today (float2 atomics);dq bulk;tiled, dq bulk}
BENCH_D=${BENCH_D:-64}  # the bench's head width
CALL=${CALL:-}  # a suffix of the bench's and ncu's files (a second call's)
NCU_SECTIONS=${NCU_SECTIONS:---section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis}
STEP=${STEP:-today (float2 atomics);best}  # best: the variants stage's fastest backward at D 64
PRE="import os, sys
if os.environ.get('CUBINS'):
    import cubins; cubins.install(os.environ['CUBINS'])
import attention_round10_variants as rv"
for stage in ${*:-tests variants bench ncu}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      timeout ${TESTS_S:-60} $PY -c "$PRE
import pytest
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-rs', '-s',
                      'tests/test_attention_fused_gpu.py', 'tests/gpu/test_halves.py']))" \
        2>&1 | tee "$W/attention_pytest.log" | grep -E "FAILED|ERROR|passed|failed|Error" | tail -20
      ;;
    variants)
      timeout ${VARIANTS_S:-100} $PY benchmarks/attention_round10_variants.py "$W/attention_variants.json" \
        2>&1 | tee "$W/attention_variants.log"
      ;;
    broken)  # the new GPU test fails on broken ways: v4 adding to the wrong rows, a warp's first row's
      # bulk reduce left out. (Call 2 broke v4 by its columns instead: a misaligned address, whose
      # sticky error also failed the bulk test after it; rows keep the addresses aligned.)
      timeout ${BROKEN_S:-40} $PY -c "$PRE
import pytest
from smallem.backends.cuda import attention_mma as am
am.KERNELS_DQ = am.KERNELS_DQ.replace('(odd ? 8 : 0)', '(odd ? 0 : 8)').replace('if (r0 + r < T)', 'if (r0 + r < T && r > 0)')
am._source.cache_clear()
ids = [f'tests/test_attention_fused_gpu.py::test_each_way_of_adding_dq_matches_float64[0-1-600-600-2-64-True-{w}-bf16]'
       for w in (0, 1, 2)]
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-rs', '-s'] + ids))" 2>&1 | tee "$W/attention_pytest_broken.log" | grep -E "FAILED|passed|failed|Error" | tail -20
      ;;
    bench)
      BENCH="$BENCH" timeout ${BENCH_S:-70} $PY -c "$PRE
import json
from smallem.tools import bench_attention as b
from smallem.tools.bench import machine
b.REPS = 10
out = {'device': 'gpu', 'machine': machine()}
for i, name in enumerate(os.environ['BENCH'].split(';')):
    rv.use(name)
    print('=== ' + name, flush=True)
    out[f'{i} {name}'] = b.attention_rows('gpu', i == 0, print, ($BENCH_D,), (1024, 2048, 4096), ('bf16',))
    json.dump(out, open(sys.argv[1], 'w'), indent=1)" "$W/attention_bench_d$BENCH_D$CALL.json" 2>&1 \
        | tee "$W/attention_bench_d$BENCH_D$CALL.log"
      ;;
    step)  # the bf16 Transformer step at 8 x 512 (T 256, D 64) against PyTorch's bf16, per config of STEP
      STEP="$STEP" timeout ${STEP_S:-80} $PY -c "$PRE
from smallem.tools import bench_precision as bp
from smallem.data import load_corpus
tokens = load_corpus(None).train
print(bp.HEAD)
import json
rows = [r for r in json.load(open(sys.argv[1])) if r['D'] == 64 and 'backward_ms' in r]
total = {n: sum(r['backward_ms'] for r in rows if r['impl'] == n) for n in rv.VARIANTS
         if sum(r['impl'] == n for r in rows) == len({r['T'] for r in rows})}
best = min((n for n in total if n != 'today (float2 atomics)'), key=total.get)  # the variants' fastest
print('backward ms summed over T (D 64):', {n: round(x, 3) for n, x in total.items()}, '-> best:', best)
for name in os.environ['STEP'].replace('best', best).split(';'):
    rv.use(name)
    print('=== ' + name, flush=True)
    bp.compare('transformer', '8x512', bp.SIZES['8x512'], ['bf16'], 64, tokens, (5, 40, 10), 0, print)" \
        "$W/attention_variants.json" 2>&1 | tee "$W/step_bf16.log"
      ;;
    ncu)
      NCU="$NCU" timeout ${NCU_S:-50} ncu --clock-control none --kernel-name "regex:flash_mma_keyq_bf16_64" \
        -c $(echo "$NCU" | tr ';' '\n' | wc -l) \
        $NCU_SECTIONS $PY -c "$PRE
from attention_variants import once
for name in os.environ['NCU'].split(';'):
    rv.use(name)
    print('=== ' + name, flush=True)
    once('bf16', 4096, 64)" > "$W/attention_ncu_keyq$CALL.txt" 2>&1
      grep -E "^=== |flash_|Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp|Eligible Warps|stalled" \
        "$W/attention_ncu_keyq$CALL.txt" | head -40
      ;;
  esac
  tar -C "$W" -czf "$OUT/attention_round10.tar.gz" .
done
echo "=== done ($(date +%T))"

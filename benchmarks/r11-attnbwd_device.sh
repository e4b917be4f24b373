#!/usr/bin/env bash
# Issue 37's device call (round 11, branch r11-attnbwd): keyq by wgmma (CONFIG["key_wg"]) beside
# today's default keyq (the 2-D tiled mma.sync one) at D 64, bf16. Stages, each under its own limit:
#   sass      keyq's SASS per way (cuobjdump): HGMMA, HMMA, local loads/stores, barriers, reductions
#   tests     the attention GPU tests (test_attention_fused_gpu.py, gpu/test_halves.py; the wgmma
#             keyq's own: 8 shapes x bf16, fp16 x dQ by mma.sync or wgmma x registers capped or not)
#   nvrtc     the adopted keyq compiled as a user's run compiles it (NVRTC, sm_90a), its float64 tests
#   broken    the wgmma keyq's test against the kernel broken on purpose (r11_attnbwd_variants.BREAKS):
#             each must fail
#   variants  r11_attnbwd_variants.py: each variant checked against float64, then fwd / bwd timed
#   bench     `smallem bench --attention`'s D 64 bf16 rows (captured) for each config of BENCH in one
#             process, PyTorch's SDPA rows (default = cuDNN, flash) beside the first; "best": the
#             variants stage's fastest backward (summed over T) other than the default
#   ncu       keyq alone at D 64, T 4,096 under ncu, for each config of NCU ("best" as above)
#   OUT=DIR CUBINS=DIR bash benchmarks/r11-attnbwd_device.sh [STAGE ...]  -> DIR/r11-attnbwd.tar.gz
# The tensor-core modules come as cubins compiled here (benchmarks/cubins.py DIR variants, then
# benchmarks/r11_attnbwd_variants.py --build DIR for the broken ones; nvcc -arch=sm_90a).
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
W=$OUT/w
mkdir -p "$W"
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
BENCH=${BENCH:-tiled (round 10);best}
NCU=${NCU:-tiled (round 10);best}
CALL=${CALL:-1}
NCU_SECTIONS=${NCU_SECTIONS:---section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats}
PRE="import os, sys, json
if os.environ.get('CUBINS'):
    import cubins; cubins.install(os.environ['CUBINS'])
import attention_round10_variants as rv, r11_attnbwd_variants as v11
rv.VARIANTS, rv.DEFAULT = v11.VARIANTS, v11.DEFAULT
def best():  # the variants stage's fastest backward summed over T, other than the default, correct
    import glob
    rows = [r for path in glob.glob(os.environ['W'] + '/variants$CALL.*.json') for r in json.load(open(path))
            if 'backward_ms' in r]
    ts = {r['T'] for r in rows}
    total = {n: sum(r['backward_ms'] for r in rows if r['impl'] == n) for n in v11.VARIANTS
             if n != 'tiled (round 10)' and len({r['T'] for r in rows if r['impl'] == n}) == len(ts)}
    print('backward ms summed over T:', {n: round(x, 3) for n, x in total.items()}, flush=True)
    return min(total, key=total.get) if total else 'key wgmma'
def names(spec):
    return [best() if n == 'best' else n for n in spec.split(';')]"
export W
for stage in ${*:-sass tests broken variants bench ncu}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      # two processes: the tests of what was there, then the new kernel's (a fault there, sticky in
      # its CUDA context, cannot fail the others)
      for part in "not wgmma_key and not cpus_rounding and not captured_attention" \
                  "wgmma_key or cpus_rounding or captured_attention"; do
        timeout ${TESTS_S:-40} $PY -c "$PRE
import pytest
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-rs', '-s', '-k', sys.argv[1],
                      'tests/test_attention_fused_gpu.py', 'tests/gpu/test_halves.py']))" "$part" \
          >> "$W/pytest$CALL.log" 2>&1
        echo "rc $? ($part)"
      done
      grep -E "FAILED|ERROR|passed|failed|Error|key_wg" "$W/pytest$CALL.log" | tail -40
      ;;
    sass)  # keyq's instructions in each way's cubin: HGMMA (wgmma), HMMA (mma.sync), local memory
      $PY -c "$PRE
from smallem.backends.cuda import attention_mma as am
import subprocess
for name in v11.VARIANTS:
    path = os.environ['CUBINS'] + '/' + cubins.name(am.source(v11.configured(v11.VARIANTS[name]), ('bf16',), (64,), False))
    sass = subprocess.run(['cuobjdump', '--dump-sass', '-fun', 'flash_mma_keyq_bf16_64', path], capture_output=True, text=True).stdout
    print(f'{name:32s}', {k: sass.count(k) for k in ('HGMMA', 'HMMA', 'LDL', 'STL', 'BAR.SYNC', 'RED.E.ADD')}, flush=True)" 2>&1 | tee "$W/sass$CALL.log"
      ;;
    nvrtc)  # the adopted keyq as a user's run compiles it: no cubins, SM90A "auto" -> NVRTC's sm_90a
      # (D 64: the default path's float64 tests and the way-3 rows of the wgmma keyq's; two modules)
      CUBINS= timeout ${NVRTC_S:-120} $PY -c "
import re, subprocess, sys, pytest
from smallem.backends.cuda import attention_mma as am
print('SM90A', am.SM90A, '->', am.sm90a(), flush=True)
ids = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', '-q', 'tests/test_attention_fused_gpu.py'],
                     capture_output=True, text=True).stdout.split()
pick = re.compile(r'wgmma_key_kernel_matches_float64\[.*-3-0-0-(bf16|fp16)\]|within_the_format\[.*-64-(True|False)-(bf16|fp16)\]')
rc = pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-s'] + [i for i in ids if pick.search(i)])
fn = am.mma_kernel('keyq', 'bf16', 64, False)
print('keyq bf16 64 by NVRTC:', getattr(fn, 'num_regs', '?'), 'registers,', getattr(fn, 'local_size_bytes', '?'),
      'local bytes', flush=True)
sys.exit(int(rc))" 2>&1 | tee "$W/nvrtc$CALL.log" | grep -E "SM90A|passed|failed|NVRTC|Error" | tail -8
      ;;
    broken)
      timeout ${BROKEN_S:-25} $PY -c "$PRE
import pytest
from smallem.backends.cuda import attention_mma_grad_wg as wg, attention_mma as am
for name, (_, _, way) in v11.BREAKS.items():
    v11.use_broken(name)
    rc = pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-s', v11.BROKEN_TEST.format(way)])
    print(f'BROKEN {name!r} (way {way}): pytest rc {int(rc)} ->', 'failed, as it must' if rc == 1 else 'NOT FAILED', flush=True)
am.KERNELS_BACKWARD_WG = wg.KERNELS_BACKWARD_WG
am._source.cache_clear()" > "$W/broken$CALL.log" 2>&1
      grep -E "BROKEN|key_wg|Error" "$W/broken$CALL.log" | tail -12
      ;;
    variants)  # in three processes (a fault in one kernel cannot stop the others' rows), each
      # beginning and ending with the default
      i=0
      for only in "tiled (round 10);key wgmma;key wgmma, LF" "tiled (round 10);key+dQ wgmma" \
                  "tiled (round 10);all wgmma from smem;all wgmma from smem, 3 blocks;all wgmma from smem, 3 blocks, LF"; do
        i=$((i + 1))
        ONLY="$only" timeout ${VARIANTS_S:-25} $PY benchmarks/r11_attnbwd_variants.py "$W/variants$CALL.$i.json" \
          2>&1 | tee -a "$W/variants$CALL.log"
      done
      ;;
    bench)
      BENCH="$BENCH" timeout ${BENCH_S:-60} $PY -c "$PRE
from smallem.tools import bench_attention as b
from smallem.tools.bench import machine
b.REPS = 10
out = {'device': 'gpu', 'machine': machine()}
for i, name in enumerate(names(os.environ['BENCH'])):
    rv.use(name)
    print('=== ' + name, flush=True)
    out[f'{i} {name}'] = b.attention_rows('gpu', i == 0, print, (64,), (1024, 2048, 4096), ('bf16',))
    json.dump(out, open(sys.argv[1], 'w'), indent=1)" "$W/bench$CALL.json" 2>&1 | tee "$W/bench$CALL.log"
      ;;
    ncu)
      NCU="$NCU" $PY -c "$PRE
print(';'.join(names(os.environ['NCU'])))" > "$W/ncu_names$CALL.txt" 2>/dev/null
      NCU="$(tail -1 "$W/ncu_names$CALL.txt")" timeout ${NCU_S:-40} ncu --clock-control none \
        --kernel-name "regex:flash_mma_keyq_bf16_64" -c $(echo "$NCU" | tr ';' '\n' | wc -l) \
        $NCU_SECTIONS $PY -c "$PRE
for name in os.environ['NCU'].split(';'):
    rv.use(name)
    print('=== ' + name, flush=True)
    v11.once()" > "$W/ncu_keyq$CALL.txt" 2>&1
      grep -E "^=== |flash_|Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp|Eligible Warps|No Eligible|Block Limit" \
        "$W/ncu_keyq$CALL.txt" | head -60
      ;;
  esac
  tar -C "$W" -czf "$OUT/r11-attnbwd.tar.gz" .
done
echo "=== done ($(date +%T))"

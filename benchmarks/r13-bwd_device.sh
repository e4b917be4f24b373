#!/usr/bin/env bash
# Issue 37's device call (round 13, branch r13-bwd): the wgmma keyq with 1, 2 or 3 warpgroups of 64
# keys a block (CONFIG["key_wg"]) and its LF twin from T CONFIG["key_lf"], at D 64, bf16. Stages,
# each under its own limit:
#   sass      keyq's and keyq_lf's registers (cuobjdump) and SASS counts in each variant's cubin
#   tests     the attention GPU tests (test_attention_fused_gpu.py, gpu/test_halves.py), in two
#             processes (the wgmma keyq's own tests apart)
#   nvrtc     the default keyq compiled as a user's run compiles it (NVRTC, sm_90a): registers and
#             local memory of flash_mma_keyq_* and flash_mma_keyq_lf_* (the default's and 3
#             warpgroups'), the default's float64 tests at D 64
#   broken    the wgmma keyq's test against the kernel broken on purpose (r13_bwd_variants.BREAKS)
#   variants  r13_bwd_variants.py: each variant checked against float64, then fwd / bwd timed
#   variants_nvrtc  the same (ONLY_NVRTC's) from NVRTC's modules
#   bench     `smallem bench --attention`'s D 64 bf16 rows (captured) for each config of BENCH in one
#             process, PyTorch's SDPA rows (default = cuDNN, flash) beside the first; "best": the
#             variants stage's fastest backward summed over T other than the default
#   OUT=DIR CUBINS=DIR bash benchmarks/r13-bwd_device.sh [STAGE ...]  -> DIR/r13-bwd.tar.gz
# The modules come as cubins compiled here (benchmarks/cubins.py DIR variants, then
# benchmarks/r13_bwd_variants.py --build DIR for the broken ones; nvcc -arch=sm_90a).
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
W=${W_DIR:-$OUT/w}  # the logs (tarred into $OUT after each stage)
mkdir -p "$W"
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
BENCH=${BENCH:-default;best}
CALL=${CALL:-1}
PRE="import os, sys, json
if os.environ.get('CUBINS'):
    import cubins; cubins.install(os.environ['CUBINS'])
import attention_round10_variants as rv, r13_bwd_variants as v13
rv.VARIANTS, rv.DEFAULT = v13.VARIANTS, v13.DEFAULT
def best():  # the variants stage's fastest backward summed over T, other than the default, correct
    import glob
    rows = [r for path in glob.glob(os.environ['W'] + '/variants$CALL.*.json') for r in json.load(open(path))
            if 'backward_ms' in r]
    ts, last = {r['T'] for r in rows}, {(r['impl'], r['T']): r['backward_ms'] for r in rows}
    # a variant's last row a T (call 1 summed every row: the first variant, in both processes twice
    # over, came out at 11.9 ms)
    total = {n: sum(last[n, t] for t in ts) for n in v13.VARIANTS
             if n != 'default' and all((n, t) in last for t in ts)}
    print('backward ms summed over T:', {n: round(x, 3) for n, x in total.items()}, flush=True)
    return min(total, key=total.get) if total else 'wg3'
def names(spec):
    return [best() if n == 'best' else n for n in spec.split(';')]"
export W
for stage in ${*:-sass tests nvrtc broken variants bench}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      # the new warpgroups' tests apart (a fault, sticky in its CUDA context, cannot fail the others)
      for part in "not wgmma_key and not cpus_rounding and not captured_attention" \
                  "wgmma_key or cpus_rounding or captured_attention"; do
        timeout ${TESTS_S:-60} $PY -c "$PRE
import pytest
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-rs', '-s', '-k', sys.argv[1],
                      'tests/test_attention_fused_gpu.py', 'tests/gpu/test_halves.py']))" "$part" \
          >> "$W/pytest$CALL.log" 2>&1
        echo "rc $? ($part)"
      done
      grep -E "FAILED|ERROR|passed|failed|Error|T 4,100" "$W/pytest$CALL.log" | tail -40
      ;;
    sass)  # keyq's (and its LF twin's) registers and instructions in each variant's cubin (bf16, no
      # copies): the atomics are RED.E.ADD.F32 (or ATOMG.E.ADD), not "ATOMG" alone
      $PY -c "$PRE
from smallem.backends.cuda import attention_mma as am
import subprocess
for name, change in v13.VARIANTS.items():
    path = os.environ['CUBINS'] + '/' + cubins.name(am.source(v13.configured(change), ('bf16',), (64,), False))
    use = subprocess.run(['cuobjdump', '--dump-resource-usage', path], capture_output=True, text=True).stdout
    for fn in ('flash_mma_keyq_bf16_64', 'flash_mma_keyq_lf_bf16_64'):
        sass = subprocess.run(['cuobjdump', '--dump-sass', '-fun', fn, path], capture_output=True, text=True).stdout
        res = [p.split(chr(10))[1].strip() for p in use.split('Function ') if p.startswith(fn + ':')]
        print(f'{name:16s} {fn:26s}', res[0] if res else '-', {k: sass.count(k) for k in (
            'HGMMA', 'HMMA', 'LDL', 'STL', 'BAR.SYNC', 'BAR.SYNC.DEFER', 'RED.E.ADD.F32', 'ATOMG.E.ADD')}, flush=True)" \
        2>&1 | tee "$W/sass$CALL.log"
      ;;
    nvrtc)  # the default keyq as a user's run compiles it: no cubins, SM90A "auto" -> NVRTC's sm_90a
      CUBINS= timeout ${NVRTC_S:-120} $PY -c "
import re, subprocess, sys, pytest
from smallem.backends.cuda import attention_mma as am
print('SM90A', am.SM90A, '->', am.sm90a(), 'key_wg', am.CONFIG['key_wg'][64], 'key_lf', am.CONFIG['key_lf'][64], flush=True)
default = dict(am.CONFIG['key'])
# the default's module, then with NVRTC_ALSO's blocks a multiprocessor as the key kernel's bounds
# (compiled only; calls 1, 2 compiled 3 warpgroups and the overlaps here, switches now gone)
for held in [default[64][3]] + [int(x) for x in sys.argv[1].split()]:
    am.CONFIG['key'][64] = (*default[64][:3], held)
    for kind in ('keyq', 'keyq_lf'):
        fn = am.mma_kernel(kind, 'bf16', 64, False)
        print(f'bounds {held}: {kind} bf16 64 by NVRTC:', fn.num_regs, 'registers,',
              fn.local_size_bytes, 'local bytes', flush=True)
am.CONFIG['key'] = default
# collected without the project's addopts (nbval's options: where nbval is missing the collection
# printed nothing, and round 11's stage ran no test)
ids = subprocess.run([sys.executable, '-m', 'pytest', '-o', 'addopts=', '-p', 'no:cacheprovider', '--collect-only',
                      '-q', 'tests/test_attention_fused_gpu.py'], capture_output=True, text=True).stdout.split()
pick = re.compile(r'within_the_format\[.*-64-(True|False)-bf16\]')  # the module compiled above
ids = [i for i in ids if pick.search(i)]
print('NVRTC tests picked:', len(ids), flush=True)
sys.exit(int(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-s'] + ids)) if ids else 3)" \
        "${NVRTC_ALSO:-3}" \
        2>&1 | tee "$W/nvrtc$CALL.log" | grep -E "SM90A|passed|failed|NVRTC|Error" | tail -8
      ;;
    broken)
      timeout ${BROKEN_S:-40} $PY -c "$PRE
import pytest
from smallem.backends.cuda import attention_mma_grad_wg as wg, attention_mma as am
for name, (_, _, change, test) in v13.BREAKS.items():
    v13.use_broken(name)
    rc = pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-s', test])
    print(f'BROKEN {name!r} ({change}): pytest rc {int(rc)} ->', 'failed, as it must' if rc == 1 else 'NOT FAILED', flush=True)
am.KERNELS_BACKWARD_WG = wg.KERNELS_BACKWARD_WG
am._source.cache_clear()" > "$W/broken$CALL.log" 2>&1
      grep -E "BROKEN|Error" "$W/broken$CALL.log" | tail -12
      ;;
    variants)  # in two processes (a fault in one kernel cannot stop the others' rows), each
      # beginning and ending with the first
      i=0
      # ONLY_SETS: the processes' variants, ';' between names, '|' between processes
      IFS='|' read -ra sets <<< "${ONLY_SETS:-wg1 (round 11);wg1, LF;wg3;wg3, LF|wg1 (round 11);wg2;wg2, LF}"
      for only in "${sets[@]}"; do
        i=$((i + 1))
        ONLY="$only" timeout ${VARIANTS_S:-40} $PY benchmarks/r13_bwd_variants.py "$W/variants$CALL.$i.json" \
          2>&1 | tee -a "$W/variants$CALL.log"
      done
      ;;
    variants_nvrtc)  # the variants as a user's run compiles them (NVRTC, sm_90a), one process
      CUBINS= ONLY="${ONLY_NVRTC:-default}" timeout ${VARIANTS_S:-40} $PY \
        benchmarks/r13_bwd_variants.py "$W/variants_nvrtc$CALL.json" 2>&1 | tee -a "$W/variants_nvrtc$CALL.log"
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
  esac
  tar -C "$W" -czf "$OUT/r13-bwd.tar.gz" .
done
echo "=== done ($(date +%T))"

#!/usr/bin/env bash
# Issue 37's device call (round 13, branch r13-fwd): the forward of CONFIG["forward_wg"]
# (attention_mma_forward_wgq.py) at D 64, bf16. Stages, each under its own limit:
#   tests   the attention GPU tests (-m gpu -k attention: test_attention_fused_gpu.py,
#           test_attention_kernels.py, gpu/test_halves.py), the new forward's own in a second process
#   broken  the new forward's float64 test against each kernel of r13_fwd.BREAKS: each must fail
#   check   the new forward's float64 test (bf16) under each variant's tiles (r13_fwd.VARIANTS)
#   time    r13_fwd.py time: forward alone and forward + backward, each variant (from T 0) and round 10's
#   bench   `smallem bench --attention`'s D 64 bf16 rows (captured; PyTorch's SDPA beside them)
#   nvrtc   the default modules compiled as a user's run compiles them (NVRTC, sm_90a): the new
#           forward's registers and local memory, its float64 tests
#   ncu     the forward alone at T 4,096 under ncu, round 10's and round 13's
# STOP_ON_FAIL=1: no stage after tests where the new forward's own tests failed. USE=NAME: the
# tests and bench under r13_fwd.VARIANTS[NAME]'s tiles (best: the time stage's fastest). PARTS:
# the tests' -k selections, ';' between (the second's rc decides STOP_ON_FAIL).
#   OUT=DIR CUBINS=DIR CALL=N bash benchmarks/r13-fwd_device.sh [STAGE ...]  -> DIR/r13-fwd.tar.gz
# The modules come as cubins compiled here (benchmarks/cubins.py DIR, then r13_fwd.py build DIR).
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
if os.environ.get('USE'):  # the tests under a variant's tiles (best: the time stage's fastest)
    import r13_fwd
    use = os.environ['USE']
    r13_fwd.use(r13_fwd.best(os.environ['W'] + '/time' + os.environ['CALL'] + '.json') if use == 'best' else use)
    print('USE', use, r13_fwd.attention_mma.CONFIG['forward_wg'], flush=True)"
export W CALL
for stage in ${*:-tests broken time bench}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      IFS=';' read -ra parts <<< "${PARTS:-attention and not long_sequences;long_sequences}"
      for part in "${parts[@]}"; do
        timeout ${TESTS_S:-60} $PY -c "$PRE
import pytest
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-rs', '-m', 'gpu', '-k', sys.argv[1],
                      'tests/test_attention_fused_gpu.py', 'tests/test_attention_kernels.py',
                      'tests/gpu/test_halves.py']))" "$part" >> "$W/pytest$CALL.log" 2>&1
        rc=$?
        echo "rc $rc ($part)"
      done
      grep -E "^USE|FAILED|ERROR|passed|failed|Error" "$W/pytest$CALL.log" | tail -30
      if [ "$rc" != 0 ] && [ -n "${STOP_ON_FAIL:-}" ]; then  # the new forward's own failed: no timing
        tar -C "$W" -czf "$OUT/r13-fwd.tar.gz" .
        echo "=== stopped: the new forward's tests failed"; exit 1
      fi
      ;;
    broken)
      timeout ${BROKEN_S:-40} $PY benchmarks/r13_fwd.py broken > "$W/broken$CALL.log" 2>&1
      grep -E "BROKEN|Error" "$W/broken$CALL.log" | tail -12
      ;;
    check)
      timeout ${CHECK_S:-60} $PY benchmarks/r13_fwd.py check > "$W/check$CALL.log" 2>&1
      grep -E "CHECK|Error" "$W/check$CALL.log" | tail -12
      ;;
    time)
      timeout ${TIME_S:-60} $PY benchmarks/r13_fwd.py time "$W/time$CALL.json" 2>&1 | tee "$W/time$CALL.log"
      ;;
    bench)
      timeout ${BENCH_S:-60} $PY -c "$PRE
import json
from smallem.tools import bench_attention as b
from smallem.tools.bench import machine
out = {'device': 'gpu', 'machine': machine()}
out['rows'] = b.attention_rows('gpu', True, print, (64,), (1024, 2048, 4096), ('bf16',))
json.dump(out, open(sys.argv[1], 'w'), indent=1)" "$W/bench$CALL.json" 2>&1 | tee "$W/bench$CALL.log"
      ;;
    nvrtc)  # no cubins: SM90A "auto" -> NVRTC's sm_90a, as a user's run
      CUBINS= timeout ${NVRTC_S:-150} $PY -c "
import os, sys, pytest
from smallem.backends.cuda import attention_mma as am
if os.environ.get('USE'):
    import r13_fwd
    use = os.environ['USE']
    r13_fwd.use(r13_fwd.best(os.environ['W'] + '/time' + os.environ['CALL'] + '.json') if use == 'best' else use)
print('SM90A', am.SM90A, '->', am.sm90a(), am.CONFIG['forward_wg'], flush=True)
fn = am.mma_kernel('forwardwg', 'bf16', 64, False)
print('forwardwg bf16 64 by NVRTC:', fn.num_regs, 'registers,', fn.local_size_bytes, 'local bytes', flush=True)
rc = pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-s', '-k', 'bf16 and (2048 or 1000)',
                  'tests/test_attention_fused_gpu.py::test_the_long_sequences_forward_matches_float64'])
sys.exit(int(rc))" 2>&1 | tee "$W/nvrtc$CALL.log" | grep -E "SM90A|passed|failed|NVRTC|Error" | tail -8
      ;;
    ncu)
      timeout ${NCU_S:-60} ncu --clock-control none --kernel-name "regex:flash_mma_forward" -c 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        $PY benchmarks/r13_fwd.py once "${NCU_NAME:-round 13}" > "$W/ncu$CALL.txt" 2>&1
      grep -E "flash_|Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Block Limit|Grid Size" \
        "$W/ncu$CALL.txt" | head -30
      ;;
  esac
  tar -C "$W" -czf "$OUT/r13-fwd.tar.gz" .
done
echo "=== done ($(date +%T))"

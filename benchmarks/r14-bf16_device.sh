#!/usr/bin/env bash
# Issue 37's device call (round 14, branch r14-bf16): the forward keeps Q's 16-bit rows, the
# backward's Q convert gone (benchmarks/r14_bf16.py). Stages, each under its own limit:
#   tests   the attention GPU tests (test_attention_fused_gpu.py, gpu/test_halves.py, gpu/test_qkv.py,
#           test_attention_kernels.py, test_precision_gpu.py -k attention), from the cubins
#   nvrtc   the D 64 bf16 modules as a user's run compiles them: registers, local bytes
#   broken  the new test against the kernels broken on purpose (r14_bf16.BREAKS)
#   bench   bench_attention's D 64 bf16 rows at T 1,024-4,096 with PyTorch's, then "before"
#           (NVRTC's modules, compiled by the nvrtc stage: CuPy's disk cache)
#   step    the captured bf16 Transformer step at 8 x 512: after, before, PyTorch (cubins)
# Round 15 (r15-bf16; no cubins: every module by NVRTC, as a user's run compiles them):
#   env     the course's test dependencies from .whl (carried) into /tmp/site
#   user    the attention GPU tests (-m "gpu or torch" -k attention, gpu/test_halves.py,
#           gpu/test_qkv.py, test_attention_kernels.py) by NVRTC, XDIST processes compiling at once
#   bench with BEFORE=FILE: round 14's forward and R15_VARIANTS too (r14_bf16.py)
#   OUT=DIR CUBINS=DIR bash benchmarks/r14-bf16_device.sh [STAGE ...]  -> DIR/r14-bf16.tar.gz
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
W=$OUT/w
mkdir -p "$W"
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}:/tmp/site PYTHONUNBUFFERED=1
PY=${PY:-python3}
PT="-o addopts= -p no:cacheprovider -q -rs"
for stage in ${*:-tests nvrtc broken bench step}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      timeout ${TESTS_S:-150} $PY -c "
import os, sys, pytest, cubins
cubins.install(os.environ['CUBINS'])
sys.exit(pytest.main('$PT'.split() + ['tests/test_attention_fused_gpu.py', 'tests/gpu/test_halves.py',
                     'tests/gpu/test_qkv.py', 'tests/test_attention_kernels.py']))" > "$W/pytest.log" 2>&1
      echo "rc $?"
      timeout ${TESTS2_S:-40} $PY -c "
import os, sys, pytest, cubins
cubins.install(os.environ['CUBINS'])
sys.exit(pytest.main('$PT'.split() + ['-k', 'attention', 'tests/test_precision_gpu.py']))" >> "$W/pytest.log" 2>&1
      echo "rc $?"
      grep -E "FAILED|ERROR|passed|failed|Error" "$W/pytest.log" | tail -30
      ;;
    env)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl ;;
    user)
      timeout ${USER_S:-240} $PY -m pytest $PT -n ${XDIST:-12} -m "gpu or torch" -k attention tests/ \
        > "$W/pytest.log" 2>&1
      echo "rc $?"
      timeout ${USER2_S:-120} $PY -m pytest $PT -n ${XDIST:-12} tests/gpu/test_halves.py tests/gpu/test_qkv.py \
        tests/test_attention_kernels.py >> "$W/pytest.log" 2>&1
      echo "rc $?"
      grep -E "^(ERROR|FAILED)|passed|failed" "$W/pytest.log" | tail -30 ;;
    nvrtc) CUBINS= timeout ${NVRTC_S:-90} $PY benchmarks/r14_bf16.py nvrtc 2>&1 | tee "$W/nvrtc.log" ;;
    broken)
      timeout ${BROKEN_S:-60} $PY benchmarks/r14_bf16.py broken > "$W/broken.log" 2>&1
      grep -E "BROKEN|Error" "$W/broken.log" | tail -8
      ;;
    bench) CUBINS= timeout ${BENCH_S:-80} $PY benchmarks/r14_bf16.py bench "$W/bench.json" 2>&1 | tee "$W/bench.log" ;;
    step) timeout ${STEP_S:-90} $PY benchmarks/r14_bf16.py step "$W/step.json" 2>&1 | tee "$W/step.log" | tail -5 ;;
  esac
  tar -C "$W" -czf "$OUT/r14-bf16.tar.gz" .
done
echo "=== done ($(date +%T))"

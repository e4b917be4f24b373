#!/usr/bin/env bash
# A round's last device call, on the merged main (round 13's `round13_final.sh`, renamed in round
# 14): every GPU and torch test as a user's run compiles them (NVRTC, sm_90a "auto"), then
# `smallem bench --attention`'s rows that issue 37's targets name (bf16 at D 64, T 1,024 ... 4,096;
# fp32 at D 32, 64, 128, T 512 ... 4,096 (FP32_D to narrow it, FP32_D= for none), each beside PyTorch's SDPA in the
# same precision, one process), the whole step in four precisions at every size (`precision`:
# `smallem bench --precision ... --sizes`) and an ncu summary of smallem's bf16 kernels at T 4,096.
#   OUT=DIR bash benchmarks/final_call.sh [STAGE ...]   (stages: env tests attention precision ncu)
#   -> DIR/final_call.tar.gz, rewritten after every stage (a call cut short keeps what ran)
set -uo pipefail
OUT=${OUT:-/tmp/final_call}; W=$OUT/w; mkdir -p "$W"
export PYTHONPATH=$PWD:$PWD/benchmarks PYTHONUNBUFFERED=1
PY=${PY:-python3}
for stage in ${*:-env tests attention ncu}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    env)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      if ls .whl/*.whl >/dev/null 2>&1; then  # the device image has no ipywidgets, nbformat
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
      fi ;;
    tests)
      PYTHONPATH=$PYTHONPATH:/tmp/site timeout ${TESTS_S:-240} $PY -m pytest -o addopts= \
        -p no:cacheprovider -q -rs -m "gpu or torch" ${TESTS_K:+-k "$TESTS_K"} \
        --continue-on-collection-errors tests/ > "$W/pytest.log" 2>&1
      grep -E "^(ERROR|FAILED)|passed|failed" "$W/pytest.log" | tail -25 ;;
    attention)
      timeout ${ATTENTION_S:-200} $PY -c "
import json, sys
from smallem.tools import bench_attention as b
from smallem.tools.bench import machine
from smallem.backends.cuda import attention_mma
out = {'device': 'gpu', 'machine': machine(), 'sm90a': str(attention_mma.sm90a())}
def save(): json.dump(out, open(sys.argv[1], 'w'), indent=1)
out['bf16'] = b.attention_rows('gpu', True, print, (64,), (1024, 2048, 4096), ('bf16',)); save()
widths = tuple(int(d) for d in sys.argv[2].split(',') if d)  # FP32_D= (empty): no float32 rows
if widths: out['fp32'] = b.attention_rows('gpu', True, print, widths, (512, 1024, 2048, 4096), ('fp32',)); save()" \
        "$W/attention_h200.json" "${FP32_D-32,64,128}" 2>&1 | tee "$W/attention.log" ;;
    precision)  # the whole step in four precisions at every size (README's step table)
      OUT=$W timeout ${PRECISION_S:-200} bash benchmarks/gpu_session.sh precision 2>&1 | tail -22 ;;
    ncu)  # smallem's kernels in one captured-free bf16 fwd + bwd at D 64, T 4,096
      timeout ${NCU_S:-90} ncu --section SpeedOfLight --section Occupancy -k regex:flash \
        $PY -c "
from smallem.tools import bench_attention as b
from smallem.backends import get_backend
be = get_backend('gpu', 'bf16'); q, k, v, g = b._inputs(be, 8, 4096, 64, 0)
run = b.smallem_pass(be, True, q, k, v, g)
for _ in range(2): run()
be.synchronize()" > "$W/ncu_bf16_t4096.txt" 2>&1
      grep -E "^  flash|Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy" \
        "$W/ncu_bf16_t4096.txt" | head -40 ;;
  esac
  tar -C "$W" -czf "$OUT/final_call.tar.gz" .
done
echo "=== done ($(date +%T))"

#!/bin/bash
# The one device call of the CPU-step work (issue 31): the small Transformer's CPU step on the
# device host's 16 cores, smallem against PyTorch, before (main, in base/) and after (this branch).
# The GPU is hidden (CUDA_VISIBLE_DEVICES=), so `smallem bench` times its CPU rows only.
#   cd .dev/cpuperf && bash benchmarks/results/round4/cpu_step_16t.sh   (logs under $OUT)
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=
LOG=${OUT:-.}/cpu_step_16t.log
HERE=$PWD
bench() {  # bench THREADS CODE [taskset cpus]
  local pin=()
  [ -n "$3" ] && pin=(taskset -c "$3")
  echo "== smallem bench --model transformer, OMP_NUM_THREADS=$1, code: $2 ${3:+(cores $3)}"
  (cd /tmp && PYTHONPATH=$2 OMP_NUM_THREADS=$1 OPENBLAS_NUM_THREADS=$1 MKL_NUM_THREADS=$1 \
    timeout 40 "${pin[@]}" python3 -m smallem bench --model transformer --no-cpu64 \
    --steps 400 --block 20 --warmup 3 2>&1 | grep -v "^timing\|ms/step$")
}
{
  echo "host: $(nproc) CPUs; $(python3 -c 'import numpy, torch; print("numpy", numpy.__version__, "torch", torch.__version__)')"
  bench 16 "$HERE/base"
  bench 16 "$HERE"
  echo "== benchmarks/cpu_step.py pair 12, OMP_NUM_THREADS=16 (after), then with 1 and 8 block threads"
  OMP_NUM_THREADS=16 PYTHONPATH=$HERE timeout 30 python3 benchmarks/cpu_step.py pair 12
  for team in 1 8; do
    echo "-- block threads: $team"
    OMP_NUM_THREADS=16 PYTHONPATH=$HERE timeout 30 python3 -c "
import json, sys; sys.argv = ['x']
from smallem.backends import numpy_fused; numpy_fused.threads = lambda: $team
sys.path.insert(0, 'benchmarks'); import cpu_step; print(json.dumps(cpu_step.pair(12)))"
  done
  echo "== benchmarks/cpu_step.py ops 6, OMP_NUM_THREADS=16 (after)"
  OMP_NUM_THREADS=16 PYTHONPATH=$HERE timeout 30 python3 benchmarks/cpu_step.py ops 6
  bench 2 "$HERE" 0,1
  echo "== tests/test_numpy_fused.py"
  PYTHONPATH=$HERE timeout 30 python3 -m pytest -o addopts= -p no:cacheprovider -q tests/test_numpy_fused.py 2>&1 | tail -2
} 2>&1 | tee "$LOG"

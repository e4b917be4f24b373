#!/bin/bash
# Before (main, exported to $BASE) and after (this branch), alternated, on the shared 2-core
# machine of the work (other sessions running: the load average is printed with each run).
#   BASE=/tmp/base bash benchmarks/results/round4/cpu_step_2t.sh > benchmarks/results/round4/cpu_step_2t.log
HERE=$(cd "$(dirname "$0")/../../.." && pwd)
PY=${PY:-$HERE/.venv/bin/python}
cd /tmp
for i in 1 2 3; do
  for v in base after; do
    [ $v = base ] && PP=$BASE || PP=$HERE
    echo "== $v: benchmarks/cpu_step.py cpu-time 12, 1 thread; $(uptime | sed 's/.*load/load/')"
    PYTHONPATH=$PP OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 $PY $HERE/benchmarks/cpu_step.py cpu-time 12
  done
done
for i in 1 2; do
  for v in base after; do
    [ $v = base ] && PP=$BASE || PP=$HERE
    echo "== $v: smallem bench --model transformer, 2 threads; $(uptime | sed 's/.*load/load/')"
    PYTHONPATH=$PP OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 $PY -m smallem bench --model transformer \
      --steps 200 --block 20 --warmup 3 --no-cpu64 2>&1 | grep -E "^(smallem cpu|PyTorch eager) +cpu|^cpu rows"
  done
done

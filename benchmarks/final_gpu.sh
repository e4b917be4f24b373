#!/usr/bin/env bash
# The round's last device call: ipywidgets (carried as wheels in .whl/) so the widget modules
# import, then every GPU test, gradcheck, checks, notebooks 02, 04-06, 09 and 10 as scripts,
# notebook 09's scatter-add race, a health-watched run, bench and the default 20,000-step run.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 OUT
bash benchmarks/gpu_session.sh env tests gradcheck checks capture 2>&1 | tail -45
timeout 60 python3 -m pytest -o addopts= -p no:cacheprovider -q -rs tests/test_stepthrough.py \
  tests/test_byhand.py tests/test_health.py tests/test_exercises_lesson09.py 2>&1 | tail -4
timeout 60 python3 benchmarks/scatter_race.py "$OUT/scatter_race.json" | tail -14
(cd notebooks && timeout 280 python3 ../benchmarks/run_notebook.py 02_the_tape.ipynb \
  04_finite_differences.ipynb 05_mlp.ipynb 06_adamw.ipynb 09_backprop_by_hand.ipynb \
  10_the_captured_step.ipynb 2>&1 | tee "$OUT/notebooks.log" | grep -E "PASSED|FAILED|passed|Error" | tail -12)
timeout 60 python3 -m smallem train --backend gpu --steps 2000 --health "$OUT/health.jsonl" \
  --json "$OUT/train_health.json" 2>/dev/null | tail -2
BENCH_STEPS=500 bash benchmarks/gpu_session.sh bench train 2>&1 | tail -22

#!/usr/bin/env bash
# Round 3, the last device call: the MLP bench before this round (.old = git archive 8c5e267) and after, notebooks 12, 11 and 10 run as scripts on the GPU (ipywidgets and its needs carried as wheels in .whl), and the 4 x 128 x 128 stretch run.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site MPLBACKEND=Agg
python3 -c 'import ipywidgets, smallem.lessons; print("ipywidgets", ipywidgets.__version__)'
echo "=== before/after MLP bench"; OUT=$OUT STEPS=300 timeout 200 bash benchmarks/before_after.sh 2>&1 | grep -E "===|smallem|hand|vs" | head -24
echo "=== notebooks on the GPU"; for nb in 12_transformer 11_attention 10_the_captured_step; do timeout 200 python3 benchmarks/run_notebook.py notebooks/$nb.ipynb > $OUT/nb_$nb.log 2>&1; tail -2 $OUT/nb_$nb.log; done
grep -E "NVIDIA H200: |GPU" $OUT/nb_12_transformer.log | head -5
echo "=== stretch: 4 x 128, 128 bytes"; timeout 120 python3 -m smallem train --model transformer --backend gpu --layers 4 --context 128 --json $OUT/train_t4x128.json 2>/dev/null | tail -3

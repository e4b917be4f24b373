#!/usr/bin/env bash
# Everything that needs the GPU, in one device call (device time is scarce); each round reuses it.
#   OUT=DIR bash benchmarks/gpu_session.sh [STAGE ...]      (from the repository root)
# Stages (default: env tests gradcheck checks notebooks clip capture bench train):
#   env          versions of the GPU, CUDA, NumPy, CuPy, torch; installs wheels carried in .whl/
#                (ipywidgets, for the notebooks that import the lesson views), when present
#   tests        the GPU and backend tests (pytest without nbval)  -> pytest.log
#   gradcheck    every rule on the GPU against cpu64's gradients    -> gradcheck_gpu.log
#   checks       smallem checks --backend gpu                        -> checks.log
#   notebooks    notebooks 01-06 run as scripts (run_notebook.py)   -> notebooks.log
#   clip         1,000 clipped GPU steps                              -> clip.log
#   capture      captured vs plain MLP step over 2,000 steps          -> capture_2000.json
#   micro        host time per CuPy/cuBLAS/torch call (micro_gpu.py) -> micro.log
#   profile      one MLP step split and counted (profile_step.py)    -> profile.log
#   bench        smallem bench (MLP)                                  -> bench_h200.json
#   train        the default 20,000-step MLP run                      -> train_gpu.json
#   train_plain  the same, not captured                               -> train_gpu_plain.json
#   transformer  the Transformer's stages below, in order (then record_transformer.py DIR)
#   bench_transformer, bench_mlp, capture_transformer, calls, profile_transformer, train_transformer
#   before_after smallem bench of .old/ (an earlier commit) and of the tree (before_after.sh)
#   gradcheck_low  every rule on the GPU in bf16 and fp16 against cpu64's, to 8 eps of the format
#   precision    smallem bench --precision fp32,tf32,bf16,fp16 --sizes -> bench_precision.json/.log
#   profile_bf16 the bf16 step's kernels at the default size and at 8 x 512 -> profile_bf16_*.txt
# At most 8 files come back from a device call: name the stages you need.
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
STAGES=${*:-env tests gradcheck checks notebooks clip capture bench train}
TRANSFORMER="bench_transformer bench_mlp capture_transformer calls profile_transformer train_transformer"
STAGES=$(for s in $STAGES; do [ "$s" = transformer ] && echo "$TRANSFORMER" || echo "$s"; done)
BENCH_STEPS=${BENCH_STEPS:-500}

for stage in $STAGES; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    env)
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      $PY -c 'import sys, numpy, cupy, torch; print(sys.version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available())'
      $PY -c 'import tqdm, matplotlib; print("tqdm", tqdm.__version__, "matplotlib", matplotlib.__version__)'
      if ls .whl/*.whl >/dev/null 2>&1; then  # the device image has no ipywidgets
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
          && export PYTHONPATH=$PYTHONPATH:/tmp/site
      fi
      $PY -c 'import ipywidgets' 2>&1 | tail -1
      $PY -c 'import smallem, smallem.training.loop, smallem.tools.bench; from smallem.backends import get_backend; print(get_backend("auto"))'
      ;;
    tests)
      # Every test marked gpu or torch, found by marker rather than listed (a new GPU test file is
      # picked up by itself). -o addopts= drops pyproject's nbval options (no nbval there). Test
      # files that import the lesson views or nbformat cannot be collected where ipywidgets and
      # Jupyter are missing (carry them as wheels in .whl/ to include them): they are named in
      # the log, and the rest runs.
      timeout 300 $PY -m pytest -o addopts= -p no:cacheprovider -q -rs -m "gpu or torch" \
        --continue-on-collection-errors tests/ 2>&1 | tee "$OUT/pytest.log" \
        | grep -v '^[.s]*$' | grep -E "^(ERROR|FAILED|SKIPPED)|passed|failed" | tail -40
      ;;
    gradcheck)
      # float32 cannot do finite differences: the GPU's gradients against cpu64's, case by case
      timeout 60 $PY -m smallem gradcheck --backend gpu 2>&1 | tee "$OUT/gradcheck_gpu.log" | tail -4
      ;;
    clip)
      timeout 90 $PY -m smallem train --backend gpu --steps 1000 --clip 1.0 --log-every 500 \
        --eval-every 1000 2>/dev/null | tee "$OUT/clip.log" | grep -E "held-out|step"
      ;;
    checks)
      timeout 90 $PY -m smallem checks --backend gpu 2>&1 | tee "$OUT/checks.log"
      ;;
    notebooks)
      # No Jupyter there: run the code cells as a script (07 and 08 need ipywidgets, CPU only)
      timeout 240 $PY benchmarks/run_notebook.py notebooks/0[1-6]_*.ipynb 2>&1 \
        | tee "$OUT/notebooks.log" | grep -E "PASSED|FAILED|passed|Error|GPU|gpu|steps|times" | tail -30
      ;;
    capture)
      timeout 120 $PY benchmarks/capture_check.py 2000 "$OUT/capture_2000.json" 2>&1 | tee "$OUT/capture.log"
      ;;
    micro)
      timeout 60 $PY benchmarks/micro_gpu.py 2>&1 | tee "$OUT/micro.log"
      ;;
    profile)
      timeout 60 $PY benchmarks/profile_step.py gpu 300 >"$OUT/profile.log" 2>&1
      head -45 "$OUT/profile.log"
      ;;
    gradcheck_low)
      for p in bf16 fp16; do
        timeout 60 $PY -m smallem gradcheck --backend gpu --precision $p 2>&1 | tail -3
      done | tee "$OUT/gradcheck_low.log"
      ;;
    precision)
      timeout 300 $PY -m smallem bench --precision fp32,tf32,bf16,fp16 --sizes \
        --json "$OUT/bench_precision.json" 2>&1 | tee "$OUT/bench_precision.log"
      ;;
    profile_bf16)
      timeout 60 $PY benchmarks/profile_transformer.py 20 "$OUT/profile_bf16_default.txt" bf16 default \
        2>&1 | head -20
      timeout 60 $PY benchmarks/profile_transformer.py 5 "$OUT/profile_bf16_8x512.txt" bf16 8x512 \
        2>&1 | head -20
      ;;
    bench)
      timeout 150 $PY -m smallem bench --steps "$BENCH_STEPS" --warmup 50 --json "$OUT/bench_h200.json" 2>&1 \
        | tee "$OUT/bench.log"
      ;;
    train)
      t0=$(date +%s.%N)
      timeout 150 $PY -m smallem train --backend gpu --json "$OUT/train_gpu.json" \
        2>"$OUT/train_progress.log" | tee "$OUT/train.log"
      echo "command wall time: $($PY -c 'import sys, time; print(round(time.time() - float(sys.argv[1]), 2))' "$t0") s" | tee -a "$OUT/train.log"
      tail -c 300 "$OUT/train_progress.log" | tr '\r' '\n' | tail -3
      ;;
    before_after)
      OUT=$OUT STEPS=300 timeout 200 bash benchmarks/before_after.sh 2>&1 | grep -E "===|smallem|hand|vs" | head -24
      ;;
    bench_transformer)
      timeout 150 $PY -m smallem bench --model transformer --steps 300 --warmup 30 --block 30 \
        --json "$OUT/bench_transformer.json" 2>&1 | tail -16
      ;;
    bench_mlp)
      timeout 120 $PY -m smallem bench --steps 500 --warmup 50 --no-cpu64 \
        --json "$OUT/bench_mlp.json" 2>&1 | tail -12
      ;;
    capture_transformer)
      timeout 150 $PY benchmarks/capture_check.py 2000 "$OUT/capture_transformer.json" transformer 2>&1 | tail -16
      ;;
    calls)
      timeout 60 $PY benchmarks/transformer_calls.py "$OUT/calls_transformer.json" 2>&1 | tail -8
      ;;
    profile_transformer)
      timeout 90 $PY benchmarks/profile_transformer.py 20 "$OUT/profile_transformer.txt" 2>&1 | tail -34
      ;;
    train_transformer)
      t0=$(date +%s.%N)
      timeout 180 $PY -m smallem train --model transformer --backend gpu \
        --json "$OUT/train_transformer.json" 2>/dev/null | tail -6
      echo "command wall time: $($PY -c 'import sys, time; print(round(time.time() - float(sys.argv[1]), 2))' "$t0") s"
      ;;
    train_plain)
      t0=$(date +%s.%N)
      timeout 150 $PY -m smallem train --backend gpu --no-capture \
        --json "$OUT/train_gpu_plain.json" 2>"$OUT/train_plain_progress.log" | tee "$OUT/train_plain.log"
      echo "command wall time: $($PY -c 'import sys, time; print(round(time.time() - float(sys.argv[1]), 2))' "$t0") s" | tee -a "$OUT/train_plain.log"
      tail -c 300 "$OUT/train_plain_progress.log" | tr '\r' '\n' | tail -3
      ;;
    *)
      echo "unknown stage $stage (see the list at the top of benchmarks/gpu_session.sh)"
      ;;
  esac
done
echo "=== done ($(date +%T))"

#!/usr/bin/env bash
# Round 3 (issue 23), in ONE device call of about 6-8 minutes on an H200: the GPU tests,
# gradcheck on the GPU, the Transformer bench (smallem plain and captured against PyTorch eager
# and CUDA graph, with and without SDPA), the MLP bench (its captured step must stay <= 0.5x
# PyTorch's graph), 2,000 plain vs captured Transformer steps, the kernels of one Transformer
# step (plain, unfused, captured), every kernel's GPU time in one step (CUPTI, through
# torch.profiler), and the default 10,000-step Transformer run, captured.
# At most 8 files come back from $OUT: session.log (everything), pytest.log, profile_transformer.txt
# and five JSONs; `python benchmarks/record_round3.py DIR` then stores the notebook's copy.
#   bash benchmarks/gpu_round3.sh            (from the repository root; OUT defaults to /tmp)
set -uo pipefail
OUT=${OUT:-/tmp/smallem-round3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
STAGES=${*:-env tests gradcheck bench_transformer bench_mlp capture calls profile train}
exec > >(tee -a "$OUT/session.log") 2>&1
if ! $PY -c 'import ipywidgets' 2>/dev/null; then  # the device image has none
  if ls .whl/*.whl >/dev/null 2>&1; then  # wheels carried as README's notes say
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=$PYTHONPATH:/tmp/site
  fi
  $PY -c 'import ipywidgets' 2>/dev/null || { export PYTHONPATH=$PYTHONPATH:$PWD/benchmarks/stubs; \
    echo "ipywidgets is missing: benchmarks/stubs' stand-in (the lessons' widgets cannot be built)"; }
fi

for stage in $STAGES; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    env)
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      $PY -c 'import sys, numpy, cupy, torch; print(sys.version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available())'
      $PY -c 'import smallem.models.transformer, smallem.tools.bench; from smallem.backends import get_backend; print(get_backend("auto"))'
      ;;
    tests)  # -o addopts= drops pyproject's nbval options (nbval may be missing there)
      timeout 240 $PY -m pytest -o addopts= -p no:cacheprovider -q -rs tests/test_gpu.py \
        tests/test_bench.py >"$OUT/pytest.log" 2>&1
      grep -E "passed|failed|error|FAILED|ERROR|SKIPPED" "$OUT/pytest.log" | tail -25
      ;;
    gradcheck)
      timeout 90 $PY -m smallem gradcheck --backend gpu 2>&1 | tail -6
      ;;
    bench_transformer)
      timeout 150 $PY -m smallem bench --model transformer --steps 300 --warmup 30 --block 30 \
        --json "$OUT/bench_transformer.json" 2>&1 | tail -16
      ;;
    bench_mlp)
      timeout 120 $PY -m smallem bench --steps 500 --warmup 50 --no-cpu64 \
        --json "$OUT/bench_mlp.json" 2>&1 | tail -12
      ;;
    capture)
      timeout 150 $PY benchmarks/capture_check.py 2000 "$OUT/capture_transformer.json" transformer 2>&1 | tail -16
      ;;
    calls)
      timeout 60 $PY benchmarks/transformer_calls.py "$OUT/calls_transformer.json" 2>&1 | tail -8
      ;;
    profile)
      timeout 90 $PY benchmarks/profile_transformer.py 20 "$OUT/profile_transformer.txt" 2>&1 | tail -34
      ;;
    train)
      t0=$(date +%s.%N)
      timeout 180 $PY -m smallem train --model transformer --backend gpu \
        --json "$OUT/train_transformer.json" 2>/dev/null | tail -6
      echo "command wall time: $($PY -c 'import sys, time; print(round(time.time() - float(sys.argv[1]), 2))' "$t0") s"
      ;;
  esac
done
echo "=== summary ($(date +%T))"
$PY benchmarks/round3_summary.py "$OUT"

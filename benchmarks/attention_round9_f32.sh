#!/usr/bin/env bash
# Issue 37's float32 device call (round 9): benchmarks/attention_f32_variants.py at D 128 and 64
# (each tile candidate checked against float64 and timed apart at T 512 … 4,096; a candidate
# replaces CONFIG's only where faster at every T; then the captured rows of the chosen tiles
# beside PyTorch's float32 SDPA), then Nsight Compute's full set on flash32_backward_128 (CONFIG's
# tiles and QB = 2's: benchmarks/profile_f32_backward.py), then the GPU test that FLOAT32 = "rows"
# gives the same bits every run. Stage kernels: the float32 GPU tests with CONFIG as committed
# (each FLOAT32 against float64, the captured replays, the rows' determinism). Stage adopt: the
# variants' chosen tiles written into this copy's attention_f32.CONFIG (on the device, so that a
# kernels stage after it tests what the variants chose; the repository's CONFIG is set by hand).
#   OUT=DIR [WIDTHS='128 64'] [LEAN=1] bash benchmarks/attention_round9_f32.sh [STAGE ...]
# (stages: variants ncu tests kernels adopt; VARIANTS_S, NCU_S, TESTS_S: each stage's limit in seconds)
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
for stage in ${*:-variants ncu tests}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    variants)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
      timeout ${VARIANTS_S:-100} $PY benchmarks/attention_f32_variants.py \
        "$OUT/attention_f32_h200.json" ${WIDTHS:-128 64} 2>&1 | tee "$OUT/attention_f32_h200.log"
      ;;
    ncu)
      timeout ${NCU_S:-45} ncu --clock-control none --set full -k regex:flash32_backward -c 2 \
        $PY benchmarks/profile_f32_backward.py > "$OUT/ncu_backward_128.txt" 2>&1
      echo "ncu exit $?"; grep -E "flash32_backward|Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|No Eligible|Issued Warp" "$OUT/ncu_backward_128.txt" | head -30
      ;;
    kernels)
      timeout ${TESTS_S:-60} $PY -m pytest -o addopts= -p no:cacheprovider -q -rs \
        tests/test_attention_fused_gpu.py -k "kernels_match_float64 or captured or same_bits" 2>&1 \
        | tee "$OUT/attention_f32_pytest.log" | grep -E "FAILED|ERROR|Error|passed|failed" | head -40
      ;;
    adopt)
      $PY benchmarks/adopt_f32_tiles.py "$OUT/attention_f32_h200.json" smallem/backends/cuda/attention_f32.py
      ;;
    tests)
      timeout ${TESTS_S:-20} $PY -m pytest -o addopts= -p no:cacheprovider -q -rs \
        tests/test_attention_fused_gpu.py -k "same_bits" 2>&1 | tee "$OUT/attention_f32_pytest.log" | tail -3
      ;;
  esac
done
echo "=== done ($(date +%T))"

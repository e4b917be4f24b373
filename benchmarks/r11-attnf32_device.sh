#!/usr/bin/env bash
# Round 11, issue 37's float32 device call (one call: a second would start a fresh machine).
# Stages, in order: variants (benchmarks/attention_f32_variants.py at WIDTHS: each TRIES pair
# checked against float64 and timed apart at T 512 … 4,096, PyTorch's SDPA forward and backward
# timed apart beside them, the tiles faster at every T chosen, then the captured
# `smallem bench --attention` rows of the chosen tiles beside PyTorch's float32 SDPA), adopt (the
# chosen tiles written into this copy's CONFIG), kernels (the float32 GPU tests on that CONFIG:
# each FLOAT32 against float64, the captured replays, the rows' same bits), ncu (Nsight Compute
# on smallem's forward and backward, CONFIG's and NCU_TILES' backward, and PyTorch's fmha_cutlassF
# / fmha_cutlassB in the same process: benchmarks/r11_attnf32_profile.py at D 128 and 64, T 2,048).
# sass: cuobjdump of SASS's cubins (none here can disassemble). CUBINS: the modules nvcc compiled
# before the call (benchmarks/r11_attnf32_cubins.py).
#   OUT=DIR CUBINS=DIR bash benchmarks/r11-attnf32_device.sh [STAGE ...]
set -uo pipefail
OUT=${OUT:-/tmp/r11-attnf32}; W=/tmp/r11-attnf32-w; mkdir -p "$W" "$OUT"  # W: tarred into OUT
# after every stage (a call returns at most 8 files; one stopped at its limit keeps the last tar)
export PYTHONPATH=$PWD:$PWD/benchmarks PYTHONUNBUFFERED=1 LEAN=${LEAN:-1}
PY=${PY:-python3}
SECTIONS="--section SpeedOfLight --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis
  --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section InstructionStats"
for stage in ${*:-variants adopt kernels sass ncu}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    variants)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$W/gpu.txt"
      timeout ${VARIANTS_S:-110} $PY benchmarks/attention_f32_variants.py "$W/attention_f32_h200.json" \
        ${WIDTHS:-128 64 32} 2>&1 | tee "$W/attention_f32_h200.log" | grep -vE "^\{'D'" | cut -c1-220
      ;;
    adopt)
      $PY benchmarks/adopt_f32_tiles.py "$W/attention_f32_h200.json" smallem/backends/cuda/attention_f32.py
      ;;
    kernels)
      timeout ${TESTS_S:-45} $PY -c "
import os, sys, pytest, cubins
cubins.install(os.environ['CUBINS'])
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-rs', '-k', sys.argv[1],
                      'tests/test_attention_fused_gpu.py']))" \
        "kernels_match_float64 or (captured and fp32) or same_bits" > "$W/attention_f32_pytest.log" 2>&1
      echo "pytest exit $?"; grep -E "^(ERROR|FAILED)|passed|failed" "$W/attention_f32_pytest.log" | tail -8
      ;;
    ncu)
      for d in ${NCU_D:-128 64}; do  # D 64 only while the call has time (BUDGET s since it began)
        [ "$d" != 128 ] && [ "$SECONDS" -gt "${BUDGET:-170}" ] && { echo "ncu $d skipped"; continue; }
        tiles=$([ "$d" = 128 ] && echo "${NCU_TILES:-64, 64, 256, 0, 16, 3}" || echo "${NCU_TILES64:-64, 64, 256, 2, 16, 3}")
        D=$d T=2048 TILES="$tiles" timeout ${NCU_S:-40} ncu --clock-control none $SECTIONS \
          -k regex:"flash32_(forward|backward)|fmha_cutlass" -c 8 \
          $PY benchmarks/r11_attnf32_profile.py > "$W/ncu_$d.txt" 2>&1
        echo "ncu $d exit $?"
        grep -E "^  .*(flash32_|fmha_cutlass)|Duration  |Registers Per|Achieved Occupancy|Compute \(SM\) Throughput" \
          "$W/ncu_$d.txt" | cut -c1-100 | head -48
      done
      ;;
    sass)  # SASS=name.cubin … of CUBINS (the D 128 backward's, CONFIG's and QB 3's): for reading here
      for f in ${SASS:-}; do cuobjdump --dump-sass "$CUBINS/$f" > "$W/${f%.cubin}.sass" 2>&1; done
      ls -la "$W"/*.sass 2>/dev/null | wc -l
      ;;
  esac
  tar -C "$W" -czf "$OUT/r11-attnf32.tar.gz" .
done
echo "=== done ($(date +%T))"

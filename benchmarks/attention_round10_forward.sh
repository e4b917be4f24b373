#!/usr/bin/env bash
# Issue 37's device calls (round 10, the bf16 attention's forward): the attention GPU tests, the
# probe (does NVRTC compile wgmma for sm_90a), the forward's variants timed captured beside today's
# CONFIG (attention_round10.py), `smallem bench --attention`'s D 64 rows per variant, ncu on the
# forward alone (D 64, T 4,096, random inputs; stalls, pipes, shared-memory wavefronts).
#   CUBINS=DIR OUT=DIR bash benchmarks/attention_round10_forward.sh [STAGE ...]  -> DIR/attention_round10_CALL.tar.gz
# (stages: probe variants tests10 tests tests2 ncu bench, each under its own time limit; DIR from
# `python benchmarks/cubins.py DIR`, nvcc 13.0 -arch=sm_90a, the same source text as NVRTC's;
# SM90A=nvrtc without CUBINS: the modules by CuPy's NVRTC with -arch=sm_90a instead).
set -uo pipefail
OUT=${OUT:-/tmp/smallem-gpu}
W=$OUT/w
mkdir -p "$W"
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
CALL=${CALL:-1}
for stage in ${*:-probe variants tests10 tests tests2 ncu bench}; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests|tests10|tests2)  # tests: all but the round-10 switches' (tests10: those); tests2: under
      # the variant DEFAULTS names (auto: bench's pick) as the defaults
      [ $stage = tests2 ] && export DEFAULTS=${DEFAULTS:-auto} VARIANTS_JSON=$W/attention_variants$CALL.json
      [ $stage = tests ] && export TESTS_K="not round_10_switches"
      [ $stage = tests10 ] && export TESTS_K="round_10_switches"
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
      limit=$(case $stage in tests) echo ${TESTS_S:-45};; tests10) echo ${TESTS10_S:-20};; *) echo ${TESTS2_S:-30};; esac)
      timeout $limit $PY -c "
import os, sys, pytest
if os.environ.get('CUBINS'):
    import cubins; cubins.install(os.environ['CUBINS'])
if os.environ.get('SM90A') == 'nvrtc':  # NVRTC's -arch=sm_90a, no cubins (the next call's check)
    from smallem.backends.cuda import attention_mma; attention_mma.SM90A = 'nvrtc'
if os.environ.get('DEFAULTS'):  # a variant of attention_round10.py as the defaults (auto: bench's pick)
    import attention_round10 as r
    name = os.environ['DEFAULTS']
    name = r.chosen(os.environ['VARIANTS_JSON'])[-1] if name == 'auto' else name
    print('tests with the defaults of', name, flush=True); r.use(name)
    sys.argv += ['-k', 'not tiled_key and not round_10_switches']  # those set their own configs
elif os.environ.get('TESTS_K'):  # call 1: the round-10 switches apart (a wgmma fault ends only them)
    sys.argv += ['-k', os.environ['TESTS_K']]
sys.exit(pytest.main(['-o', 'addopts=', '-p', 'no:cacheprovider', '-q', '-rs', '-s',
                      'tests/test_attention_fused_gpu.py', 'tests/gpu/test_halves.py'] + sys.argv[1:]))" \
        > "$W/attention_${stage}_$CALL.log" 2>&1
      grep -E "FAILED|ERROR|passed|failed|Error|tests with" "$W/attention_${stage}_$CALL.log" | tail -24
      ;;
    probe)
      timeout ${PROBE_S:-30} $PY benchmarks/attention_round10.py probe 2>&1 | tee "$W/probe$CALL.log"
      ;;
    variants)  # the mma.sync variants in one process, each wgmma one in its own (a fault ends only it)
      rm -f "$W/attention_variants$CALL.json"
      for only in "round 9;LF;LF+LZ" WG8P+LF+LZ WG4P+LF+LZ; do
        limit=$([ "$only" = "round 9;LF;LF+LZ" ] && echo ${VARIANTS_S:-35} || echo ${VARIANT_WG_S:-15})
        TORCH=$([ "$only" = "round 9;LF;LF+LZ" ] && echo 1 || echo 0) ONLY=$only timeout $limit $PY benchmarks/attention_round10.py variants \
          "$W/attention_variants$CALL.json" 2>&1 | tee -a "$W/attention_variants$CALL.log"
      done
      ;;
    bench)
      VARIANTS_JSON=$W/attention_variants$CALL.json timeout ${BENCH_S:-90} $PY benchmarks/attention_round10.py bench "$W/attention_bench$CALL.json" \
        2>&1 | tee "$W/attention_bench$CALL.log"
      ;;
    ncu)
      timeout ${NCU_S:-60} ncu --clock-control none --kernel-name "regex:flash_mma_forward_bf16_64" \
        --launch-skip 0 --launch-count ${NCU_C:-6} \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section MemoryWorkloadAnalysis_Tables --section InstructionStats \
        env VARIANTS_JSON=$W/attention_variants$CALL.json $PY benchmarks/attention_round10.py once "${NCU_VARIANTS:-auto}" \
        > "$W/attention_ncu$CALL.txt" 2>&1
      grep -E "flash_|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall|Bank" \
        "$W/attention_ncu$CALL.txt" | head -60
      ;;
  esac
  tar -C "$W" -czf "$OUT/attention_round10_$CALL.tar.gz" .
done
echo "=== done ($(date +%T))"

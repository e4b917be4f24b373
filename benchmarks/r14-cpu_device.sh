#!/usr/bin/env bash
# Issue 38, round 14's host-CPU call (GPU hidden): r11-cpu16_device.sh PART=3 on this tree beside
# BASE (default: base/ beside this tree's root, 15eba04's smallem/ and benchmarks/ from
# `git archive 15eba04 -- smallem benchmarks pyproject.toml ':!benchmarks/results'`), two rounds at
# 16 threads, 2 pinned cores (0, 1) and 1 (core 0), each row alone; this tree with SMALLEM_DW_CUT=rows
# (round 13's weight-gradient cut) at 16 and 1; the step by op at 16 after round 1 (~125 s of
# command on a warm machine; CONFIGS=16 NO_OPS=1 for 16 threads alone, ~60 s).
#   OUT=folder bash benchmarks/r14-cpu_device.sh      -> OUT/cpu16_part3.tgz (logs/rows.jsonl, ops.jsonl)
cd "$(dirname "$0")/.." || exit
export PYTHONPATH=$PWD BASE=${BASE:-$PWD/base} OUT=${OUT:-/tmp/r14-cpu} PART=3 NO_EAGER=1 PINS=0,1
export REPS=${REPS:-2} CONFIGS=${CONFIGS:-"16 2 1"} OPS_RUNS=${OPS_RUNS:-"smallem 16"} BUDGET=${BUDGET:-115}
export ALT16_ENV=${ALT16_ENV:-SMALLEM_DW_CUT=rows} ALT1_ENV=${ALT1_ENV:-SMALLEM_DW_CUT=rows} STEPS=${STEPS:-10}
bash benchmarks/r11-cpu16_device.sh

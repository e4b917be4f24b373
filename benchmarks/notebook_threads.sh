#!/usr/bin/env bash
# Round 15 (lessons): notebooks' wall time by BLAS thread setting, on this machine as it is. Each
# run: a copy of the notebook outside the tree, a fresh kernel (nbconvert --execute, its asserts
# included), an empty progress store; the 1-minute load average before and after, the CPU time.
# Settings are interleaved round by round, so that the load falls on each alike:
#   defaults       the package as it is (the venv's install)
#   blas1          the same with OPENBLAS_NUM_THREADS=1
#   before         BEFORE's package (a folder holding an older smallem/, e.g. `git archive`), if set
#   before-blas1   the same with OPENBLAS_NUM_THREADS=1
# KEEP=dir keeps each executed copy there (SETTING_rROUND_NAME.ipynb), for comparing outputs.
# usage: [BEFORE=dir] [SETTINGS="defaults blas1"] [KEEP=dir] benchmarks/notebook_threads.sh OUT ROUNDS NB...
# -> OUT/times.tsv (round, notebook, setting, seconds, user+sys, load before, load after, status)
set -u
out=$1 rounds=$2; shift 2
py=${PY:-$PWD/.venv/bin/python}
settings=${SETTINGS:-"defaults blas1${BEFORE:+ before before-blas1}"}
mkdir -p "$out"
printf 'round\tnotebook\tsetting\tseconds\tcpu_seconds\tload_before\tload_after\tstatus\n' > "$out/times.tsv"
for r in $(seq 1 "$rounds"); do
  for nb in "$@"; do
    for s in $settings; do
      work=$(mktemp -d) && cp "$nb" "$work/" && mkdir "$work/home"
      envs=(SMALLEM_HOME="$work/home" MPLBACKEND=Agg)
      case $s in *blas1) envs+=(OPENBLAS_NUM_THREADS=1) ;; esac
      case $s in before*) envs+=(PYTHONPATH="$BEFORE") ;; esac
      load0=$(cut -d' ' -f1 /proc/loadavg)
      start=$(date +%s.%N)
      t0=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
      (cd "$work" && env "${envs[@]}" "$py" -m jupyter nbconvert --to notebook --execute --output-dir "$work" \
        --ExecutePreprocessor.timeout=3600 "$(basename "$nb")" > log 2>&1)
      status=$?
      t1=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
      secs=$(echo "$(date +%s.%N) - $start" | bc)
      cpu=$(echo "($t1 - $t0) / $(getconf CLK_TCK)" | bc -l)
      load1=$(cut -d' ' -f1 /proc/loadavg)
      printf '%s\t%s\t%s\t%.1f\t%.1f\t%s\t%s\t%s\n' "$r" "$(basename "$nb")" "$s" "$secs" "$cpu" \
        "$load0" "$load1" "$status" | tee -a "$out/times.tsv"
      [ "$status" = 0 ] || tail -20 "$work/log" > "$out/failed_${r}_${s}_$(basename "$nb").log"
      [ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$work/$(basename "$nb")" "$KEEP/${s}_r${r}_$(basename "$nb")"
      rm -rf "$work"
    done
  done
done

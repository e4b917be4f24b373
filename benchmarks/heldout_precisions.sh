#!/usr/bin/env bash
# Issue 36's last target: does a precision move what the model learns? The default Transformer's
# 10,000-step run (`smallem train --model transformer`, seed 0, the GPU, captured) in each
# precision; the held-out loss and bits per byte of each against fp32's (bf16 within 0.01).
#   OUT=folder bash benchmarks/heldout_precisions.sh [PRECISION ...]   (default: fp32 tf32 bf16 fp16)
#   -> $OUT/heldout_<precision>.json (train --json) and $OUT/heldout.json (the table)
set -uo pipefail
OUT=${OUT:-/tmp/heldout}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}; BACKEND=${BACKEND:-gpu}; STEPS=${STEPS:-}
for p in ${*:-fp32 tf32 bf16 fp16}; do
  echo "=== $p ($(date +%T))"
  $PY -m smallem train --model transformer --backend "$BACKEND" --precision "$p" --log-every 5000 \
    ${STEPS:+--steps $STEPS} --json "$OUT/heldout_$p.json" 2>&1 | grep -aE "^(held-out|bits per byte|results)"
done
$PY - "$OUT" <<'PYEOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
runs = {p.stem.split("_", 1)[1]: json.loads(p.read_text()) for p in sorted(out.glob("heldout_*.json"))}
base = runs.get("fp32")
table = {}
print(f"{'precision':>9} {'steps':>6} {'held-out loss':>13} {'vs fp32':>8} {'bits/byte':>9} {'steps/s':>8}")
for name, r in runs.items():
    delta = None if base is None else r["held_out_loss"] - base["held_out_loss"]
    table[name] = {"steps": r["steps"], "held_out_loss": r["held_out_loss"], "vs_fp32": delta,
                   "bits_per_byte": r["bits_per_byte"]["bits_per_byte"], "steps_per_second": r["steps_per_second"],
                   "backend": r["backend"], "final_train_loss": r["final_train_loss"]}
    print(f"{name:>9} {r['steps']:>6} {r['held_out_loss']:>13.4f} "
          f"{'' if delta is None else f'{delta:+.4f}':>8} {table[name]['bits_per_byte']:>9.4f} {r['steps_per_second']:>8.0f}")
(out / "heldout.json").write_text(json.dumps(table, indent=1))
PYEOF

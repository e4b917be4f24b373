"""A trained checkpoint made package data: its weights in float16 (half the bytes; a float16
holds 3 decimal digits, far finer than the weights need to give the same samples), no optimizer
state (nothing resumes from it), the run's config and history kept.
    python benchmarks/ship_model.py CHECKPOINT NAME   ->  smallem/course/l12_transformer/recorded/NAME.npz"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from smallem.files import atomic_write
from smallem.training.checkpoint import load_checkpoint

source, name = sys.argv[1], sys.argv[2]
checkpoint = load_checkpoint(source)
dest = Path(__file__).resolve().parents[1] / "smallem/course/l12_transformer/recorded" / f"{name}.npz"
meta = {k: v for k, v in checkpoint.meta.items() if k != "optimizer"}
meta["shipped"] = f"benchmarks/ship_model.py from {Path(source).name}: float16 weights, no optimizer state"
arrays = {f"param/{k}": v.astype(np.float16) for k, v in checkpoint.parameters.items()}
worst = max(float(np.max(np.abs(a.astype(np.float32) - checkpoint.parameters[k[6:]])))
            for k, a in arrays.items())
arrays["meta"] = np.array(json.dumps(meta))
atomic_write(dest, lambda fh: np.savez_compressed(fh, **arrays), what="shipped model")
print(f"wrote {dest} ({dest.stat().st_size:,} bytes); largest rounding of a weight {worst:.1e}")

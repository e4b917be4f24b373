"""Which product operands of a bf16 Transformer step still have no 16-bit copy made by their
producer (backends/cuda/halves.py): each fallback rounding of one plain step, with its shape and
the tape operation whose rule or forward asked for it.   python benchmarks/halves_census.py
"""

import traceback

import numpy as np

from smallem.backends import get_backend
from smallem.backends.cuda import halves
from smallem.optim import AdamW
from smallem.tools.bench import build
from smallem.training.step import make_step

be = get_backend("gpu", "bf16")
model = build("transformer", be, 0)
step = make_step(be, model, AdamW(lr=1e-3), capture=False)
rng = np.random.default_rng(0)
batch = lambda: (rng.integers(0, 257, (64, 64)), rng.integers(0, 257, (64, 64)))
step(*batch())
seen = []
real = halves.launch


def spy(fn, n, args):
    if args and hasattr(args[0], "shape") and fn is halves.kernel(halves.SOURCE, "round_half"):
        where = [f.name for f in traceback.extract_stack()[-8:-2]]
        seen.append((tuple(args[0].shape), args[0]._c_contiguous, " < ".join(reversed(where))))
    real(fn, n, args)


halves.launch = spy
step(*batch())
be.synchronize()
print(f"fallback roundings in one plain bf16 step: {len(seen)}")
for shape, contiguous, where in seen:
    print(f"  {shape} contiguous={contiguous}  {where}")

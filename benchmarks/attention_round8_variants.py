"""Round 8 (issue 37): the tensor-core attention with the walked tiles staged and rounded by the
kernels themselves (no convert launches) against round 7's converts, and with and without the
16-bit copies of its outputs: forward and backward timed apart (eager, device events, median of
REPS; B·T = 32,768, 8 heads, causal, bf16). `CALL=1|2 python benchmarks/attention_round8_variants.py [json]`
(CALLS: each device call's variants; call 1's dQ copy was written after a fence every query tile).
The forward's time depends on CONFIG["staged"][d][0] only, the backward's on [1]: two settings
time all four combinations.
"""

import json
import os
import sys

import attention_variants  # benchmarks/, this script's folder: its event timer
import cupy
import numpy as np

from smallem.autodiff.attention import Attention
from smallem.backends import get_backend
from smallem.backends.cuda import attention, attention_mma

TOKENS, HEADS, REPS = 32_768, 8, 10
COPIES = [True]  # round 8's attention_mma.COPIES; since round 9 each Attention says it (copies=)
SHAPES = [(1024, 64), (4096, 64), (1024, 128), (4096, 128), (1024, 32), (4096, 32)]


def split(t: int, d: int) -> tuple[float, float]:
    """(forward ms, backward ms) of the default kernels as CONFIG and COPIES stand now."""
    be = get_backend("gpu", "bf16")
    rng = np.random.default_rng(0)
    q, k, v, g = (cupy.asarray(rng.normal(size=(TOKENS // t, t, HEADS, d)), dtype=np.float32)
                  .transpose(0, 2, 1, 3) for _ in range(4))  # heads views, as the Transformer's
    op = Attention(causal=True, copies=COPIES[0])
    out = attention.attention_forward(be, q, k, v, op)
    fwd = attention_variants.timed(lambda: attention.attention_forward(be, q, k, v, op), REPS)
    bwd = attention_variants.timed(lambda: attention.attention_rule(be, g, out, q, k, v, op), REPS)
    return fwd, bwd


# name -> (CONFIG["staged"] for every width, or None: the defaults; COPIES; DQ_COPY; the widths)
CALLS = {
    1: {"staged, copies": (1, True, True, None), "converts, copies": (0, True, True, None),
        "staged, no copies": (1, False, True, (64,))},  # dQ's copy then by a fence a query tile
    2: {"defaults": (None, True, True, None),  # as call 2 ran: dQ's copy in the key kernel
        "defaults, dQ copy by the Linear": (None, True, False, (32, 64)),  # the default since
        "converts, no copies (round 7)": (0, False, False, (32, 64))}}


def main() -> None:
    rows, default = [], {w: tuple(s) for w, s in attention_mma.CONFIG["staged"].items()}
    switches = COPIES[0], attention_mma.DQ_COPY
    call = int(os.environ.get("CALL", "2"))
    for name, (staged, copies, dq_copy, widths) in CALLS[call].items():
        every = {w: (staged, staged) for w in default}
        attention_mma.CONFIG["staged"].update(default if staged is None else every)
        COPIES[0], attention_mma.DQ_COPY = copies, dq_copy
        for t, d in SHAPES:
            if widths and d not in widths:
                continue
            fwd, bwd = split(t, d)
            rows.append({"call": call, "variant": name, "T": t, "D": d, "forward_ms": fwd,
                         "backward_ms": bwd})
            print(f"{name:32s} T={t:5d} D={d:4d} fwd {fwd:7.3f} bwd {bwd:7.3f} total {fwd + bwd:7.3f} ms",
                  flush=True)
    attention_mma.CONFIG["staged"].update(default)
    COPIES[0], attention_mma.DQ_COPY = switches
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

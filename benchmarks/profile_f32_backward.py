"""One forward and backward of the float32 flash attention (backends/cuda/attention_f32.py) at
head width D, for Nsight Compute to profile the backward kernel: CONFIG's tiles, then each of
TILES' backward tiles (the same kernel name, another module), so that
`ncu --set full -k regex:flash32_backward -c N python benchmarks/profile_f32_backward.py`
sees them in that order. B·T = 32,768, 8 heads, causal; D and T from the environment
(128, 1,024), TILES as Python tuples separated by ';' ("32, 64, 256, 0, 16, 2" by default).
"""

import os

import cupy
import numpy as np

from smallem.autodiff.attention import Attention
from smallem.backends import get_backend
from smallem.backends.cuda import attention, attention_f32

D, T = int(os.environ.get("D", "128")), int(os.environ.get("T", "1024"))
TILES = [tuple(int(n) for n in part.split(",")) for part in
         os.environ.get("TILES", "32, 64, 256, 0, 16, 2").split(";") if part.strip()]


def once(be) -> None:
    rng = np.random.default_rng(0)
    q, k, v, g = (cupy.asarray(rng.normal(size=(32_768 // T, 8, T, D)), dtype=np.float32)
                  for _ in range(4))
    op = Attention(causal=True)
    out = attention.attention_forward(be, q, k, v, op)
    attention.attention_rule(be, g, out, q, k, v, op)
    cupy.cuda.get_current_stream().synchronize()


def main() -> None:
    be = get_backend("gpu", "fp32")
    attention.FLOAT32 = "flash"
    base = {d: dict(c) for d, c in attention_f32.CONFIG.items()}
    print("backward tiles, in profile order:", base[D]["backward"], *TILES, flush=True)
    once(be)
    for tiles in TILES:
        attention_f32.CONFIG = {**base, D: {**base[D], "backward": tiles}}
        attention_f32.SOURCE = attention_f32.source({D: attention_f32.CONFIG[D]})
        once(be)


if __name__ == "__main__":
    main()

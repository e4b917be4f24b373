"""Round 11, issue 37: the float32 flash attention's kernels and PyTorch's float32 SDPA kernels
(cutlass's memory-efficient fmha_cutlassF / fmha_cutlassB) in one process, for Nsight Compute to
profile side by side: smallem's forward and backward with CONFIG's tiles, then with each of TILES'
backward tiles, then SDPA's forward and backward on the same inputs:
`ncu -k regex:"flash32_(forward|backward)|fmha_cutlass" python benchmarks/r11_attnf32_profile.py`.
B·T = 32,768, 8 heads, causal; D and T from the environment (128, 2,048); TILES as in
profile_f32_backward.py (';'-separated tuples); CUBINS: nvcc's kernels (benchmarks/cubins.py).
"""

import os

import cupy
import numpy as np

from smallem.autodiff.attention import Attention
from smallem.backends import get_backend
from smallem.backends.cuda import attention, attention_f32

D, T = int(os.environ.get("D", "128")), int(os.environ.get("T", "2048"))
TILES = [tuple(int(n) for n in part.split(",")) for part in
         os.environ.get("TILES", "").split(";") if part.strip()]


def main() -> None:
    if os.environ.get("CUBINS"):
        import cubins

        cubins.install(os.environ["CUBINS"])
    be = get_backend("gpu", "fp32")
    attention.FLOAT32 = "flash"
    rng = np.random.default_rng(0)
    q, k, v, g = (cupy.asarray(rng.normal(size=(32_768 // T, 8, T, D)), dtype=np.float32)
                  for _ in range(4))
    base = {d: dict(c) for d, c in attention_f32.CONFIG.items()}
    print("backward tiles, in profile order:", base[D]["backward"], *TILES, flush=True)
    for tiles in [None, *TILES]:
        if tiles:
            attention_f32.CONFIG = {**base, D: {**base[D], "backward": tiles}}
            attention_f32.SOURCE = attention_f32.source({D: attention_f32.CONFIG[D]})
        op = Attention(causal=True)
        out = attention.attention_forward(be, q, k, v, op)
        attention.attention_rule(be, g, out, q, k, v, op)
        cupy.cuda.get_current_stream().synchronize()
    import torch
    import torch.nn.functional as F

    tq, tk, tv = (torch.as_tensor(x, device="cuda").requires_grad_() for x in (q, k, v))
    o = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    torch.autograd.grad(o, (tq, tk, tv), torch.as_tensor(g, device="cuda"))
    torch.cuda.synchronize()
    print("done", flush=True)


if __name__ == "__main__":
    main()

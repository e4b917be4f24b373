"""Round 11, issue 37: the float32 flash attention's modules that a device call of
benchmarks/r11-attnf32_device.sh compiles, built here by nvcc -arch=sm_90a under cubins.py's
names (loaded there by cubins.install, NVRTC's compile otherwise): each of
attention_f32_variants.TRIES' (one width), and CONFIG with every choice of its tiles that the
variants could adopt (all widths, as the bench rows, the tests and the profile compile them).
`python benchmarks/r11_attnf32_cubins.py DIR`
"""

import ast
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cubins  # noqa: E402

from smallem.backends.cuda import attention_f32  # noqa: E402


def tries() -> dict:
    """attention_f32_variants.TRIES, read from its source (that module needs CuPy to import)."""
    tree = ast.parse((Path(__file__).resolve().parent / "attention_f32_variants.py").read_text())
    found = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", "") == "TRIES")
    return ast.literal_eval(found)


def sources() -> set[str]:
    out = set()
    TRIES = tries()  # noqa: N806 - the variants' name
    for d, pairs in TRIES.items():
        out |= {attention_f32.source({d: {"forward": f, "backward": b}}) for f, b in pairs}
    choices = {d: list(itertools.product(dict.fromkeys(f for f, _ in pairs),
                                         dict.fromkeys(b for _, b in pairs)))
               for d, pairs in TRIES.items()}
    for pick in itertools.product(*(choices[d] for d in attention_f32.CONFIG)):
        config = {d: {"forward": f, "backward": b} for d, (f, b) in zip(attention_f32.CONFIG, pick)}
        out.add(attention_f32.source(config))
    return out


def main(folder: str) -> None:
    cubins.compile_all(folder, sources())


if __name__ == "__main__":
    main(sys.argv[1])

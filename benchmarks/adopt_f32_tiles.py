"""The tiles a run of attention_f32_variants.py chose (its JSON's "chosen") written into
attention_f32.py's CONFIG, per width: `python benchmarks/adopt_f32_tiles.py RUN.json FILE`.
Used on a device copy between the variants and the GPU tests, so that the tests run what the
variants chose; prints each CONFIG line it wrote."""

import json
import re
import sys
from pathlib import Path


def adopt(chosen: dict, text: str) -> str:
    """text with CONFIG's entry for each width of `chosen` ({"128": {"forward": [...], ...}})."""
    for d, kinds in chosen.items():
        if not d.isdigit():
            continue  # "errors_128" and the like
        pattern = rf'({d}: {{"forward": )\([\d, ]+\)(, "backward": )\([\d, ]+\)'
        fwd, bwd = (", ".join(str(n) for n in kinds[k]) for k in ("forward", "backward"))
        text, n = re.subn(pattern, rf"\g<1>({fwd})\g<2>({bwd})", text)
        if n != 1:
            raise SystemExit(f"CONFIG has no single entry for width {d}")
    return text


def main() -> None:
    run, path = Path(sys.argv[1]), Path(sys.argv[2])
    text = adopt(json.loads(run.read_text())["chosen"], path.read_text())
    path.write_text(text)
    print("\n".join(line for line in text.splitlines() if '{"forward": (' in line))


if __name__ == "__main__":
    main()

"""The command line: `smallem <command>` and `python -m smallem <command>`.

Each command parses its arguments here and calls the package; a SmallemError becomes one line
on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .errors import SmallemError


def _gradcheck(args: argparse.Namespace) -> int:
    from .gradcheck import format_table, run_all

    results = run_all(args.backend)
    print(format_table(results))
    return 0 if all(r.passed for r in results) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smallem", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("gradcheck", help="check every primitive and operation by finite differences")
    p.add_argument("--backend", default="cpu64", help="cpu64 (default; float64 is what makes a "
                   "1e-6 tolerance meaningful), cpu or gpu")
    p.set_defaults(run=_gradcheck)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except SmallemError as error:
        print(f"smallem {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"smallem {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""How smallem speaks to a user: the one exception for a mistake, the one warning, the one
wording of a number check, and the one way a number or a small tensor is written in a sentence.

An error's message is a single sentence saying what was wrong and what to do; the command line
prints it without a traceback.
"""

from typing import Any


class SmallemError(Exception):
    """A user-facing error: bad input, a shape that does not fit, a missing device."""


class SmallemWarning(UserWarning):
    """Something the user should know that does not stop the work (a corpus folder skipped, a
    run that diverged): one sentence, printed by the command line as `smallem CMD: warning: ...`."""


_KINDS = {
    "positive": "a positive number",
    "non-negative": "a number, 0 or more",
    "count": "a whole number, 1 or more",
    "whole": "a whole number, 0 or more",
}


def require(name: str, value: object, kind: str, *, optional: bool = False) -> object:
    """Check one user-given number where it is used, with one wording everywhere:
    "<name> must be a positive number, got -1". `kind` is positive, non-negative (finite
    numbers), count (an int ≥ 1) or whole (an int ≥ 0); `optional` lets None through."""
    import math

    if value is None and optional:
        return value
    if kind in ("count", "whole"):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= (kind == "count")
    else:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value) and (value > 0 if kind == "positive" else value >= 0))
    if not ok:
        raise SmallemError(f"{name} must be {_KINDS[kind]}, got {value!r}")
    return value


def fmt(x: Any, digits: int = 4, limit: int = 6) -> str:
    """A number or a small tensor in one short line, as every printout of smallem writes it:
    `digits` significant digits, a true minus sign, no "−0" (a gradient a dead unit blocked is
    exactly zero and reads so), rows of a matrix separated by "; ", "…" past `limit` numbers."""
    import numpy as np

    a = np.asarray(x, dtype=np.float64)

    def one(v: float) -> str:
        v = 0.0 if v == 0 else float(v)
        return f"{v:.{digits}g}".replace("-", "\u2212")

    if a.size == 1:
        return one(a.reshape(-1)[0])
    if a.ndim == 2 and 1 < a.shape[0] and a.size <= 2 * limit:
        return "[" + "; ".join(", ".join(one(v) for v in row) for row in a) + "]"
    flat = a.reshape(-1)
    return "[" + ", ".join(one(v) for v in flat[:limit]) + (", …" if flat.size > limit else "") + "]"

"""The one exception smallem raises for a user's mistake.

Its message is a single sentence saying what was wrong and what to do; the command line
prints it without a traceback.
"""


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

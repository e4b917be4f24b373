"""The second half of "predict, then run": `reveal(guess, measured)` prints the guess beside what
ran, judged by meaning ("False" typed as text is False, "Grow" is "grow", "(4, 3)" is a shape) and
relatively (a tiny guess is not "close" to a tiny result three orders of magnitude away).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ...errors import fmt

CLOSE = 0.05  # a number within 5 % of the measured one is well predicted
_TRUE, _FALSE = {"true", "yes", "y"}, {"false", "no", "n"}
_SHAPE = re.compile(r"^[\s(\[]*\d+(\s*[,x×*]\s*\d+)*\s*,?[\s)\]]*$")


def reveal(prediction: Any, measured: Any, what: str = "the result", *,
           factor: float | None = None, atol: float = 0.0) -> None:
    """Print the prediction beside the measured value, and say whether it was well predicted:
    within 5 % for numbers (each one, for several), or within `atol` (the tolerance the next
    cell's assert uses: "zero, to rounding"); equal for a yes/no, a word (any case) or a shape,
    and word by word for several words in any sequence; for a guess of an order of magnitude
    (`factor`, e.g. 10), within that factor counts too. A prediction left as `...` is fine:
    the measured value is shown all the same."""
    shown = _show(measured)
    if prediction is Ellipsis or prediction is None:
        print(f"No prediction written; {what} is {shown}.")
        return
    guess = _meaning(prediction, measured)
    if _close(guess, measured, atol):
        judged = "Well predicted."
    elif factor and _within(guess, measured, factor):
        judged = "Right order of magnitude."
    else:
        judged = "Read on to see why."
    print(f"You predicted {_show(prediction)}; {what} is {shown}. {judged}")


def _numeric(x: Any) -> bool:
    return isinstance(x, (int, float, np.number, np.ndarray)) and not isinstance(x, (bool, np.bool_))


def _numbers(x: Any) -> bool:
    """A number, or a tuple/list/array of numbers (not of yes/no)."""
    if _numeric(x):
        return not (isinstance(x, np.ndarray) and x.dtype == bool)
    return isinstance(x, (tuple, list)) and len(x) > 0 and all(_numbers(v) for v in x)


def _shape(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                        for v in x)


def _words(x: Any) -> bool:
    return isinstance(x, (tuple, list)) and len(x) > 0 and all(isinstance(v, str) for v in x)


def _word(x: Any) -> str:
    return x.strip().strip("'\"").strip().casefold()


def _meaning(guess: Any, measured: Any) -> Any:
    """The guess read as the kind of thing that was measured, when it is typed as text."""
    if isinstance(measured, (bool, np.bool_)):
        if isinstance(guess, str) and _word(guess) in _TRUE | _FALSE:
            return _word(guess) in _TRUE
        return guess
    if isinstance(guess, str) and _shape(measured) and _SHAPE.match(guess):
        return tuple(int(k) for k in re.findall(r"\d+", guess))
    if isinstance(guess, str) and _numbers(measured):
        try:
            return float(guess.replace("\u2212", "-"))
        except ValueError:
            return guess
    return guess


def _close(guess: Any, measured: Any, atol: float = 0.0) -> bool:
    if _words(measured):  # ("lower", "higher"): a list or tuple of the same words, any case
        return (isinstance(guess, (tuple, list)) and len(guess) == len(measured)
                and all(_close(g, m) for g, m in zip(guess, measured)))
    if isinstance(measured, (bool, np.bool_)):
        return isinstance(guess, (bool, np.bool_)) and bool(guess) == bool(measured)
    if isinstance(measured, str):
        return isinstance(guess, str) and _word(guess) == _word(measured)
    if _shape(measured):
        return (isinstance(guess, (tuple, list, np.ndarray)) and _numbers(list(guess))
                and np.shape(guess) == (len(measured),) and tuple(guess) == measured)
    if _numbers(measured) and _numbers(guess):
        g, m = np.asarray(guess, dtype=np.float64), np.asarray(measured, dtype=np.float64)
        return g.shape == m.shape and bool(np.all(np.abs(g - m) <= np.maximum(CLOSE * np.abs(m), atol)))
    return bool(guess == measured) if not isinstance(guess, np.ndarray) else False


def _within(guess: Any, measured: Any, factor: float) -> bool:
    """Every number of the guess on the measured one's side of zero, within `factor` of it."""
    if not (_numbers(measured) and _numbers(guess)):
        return False
    g, m = np.asarray(guess, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    if g.shape != m.shape or not np.all(g * m > 0):
        return False
    ratio = g / m
    return bool(np.all((1 / factor <= ratio) & (ratio <= factor)))


def _show(x: Any) -> str:
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if _numeric(x):
        return fmt(x)
    if isinstance(x, (tuple, list)) and all(_numeric(v) for v in x):
        return "(" + ", ".join(fmt(v) for v in x) + ")"
    return repr(x)

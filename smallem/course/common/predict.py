"""The second half of "predict, then run": `reveal(guess, measured)` prints the guess beside what
ran, judged by meaning ("False" typed as text is False, "Grow" is "grow", "(4, 3)" is a shape,
"float16" is fp16, ["fp16"] is its element, "1.0 (it never moves)" is 1.0) and relatively (a tiny
guess is not "close" to a tiny result three orders of magnitude away).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ...errors import fmt

CLOSE = 0.05  # a number within 5 % of the measured one is well predicted
_TRUE, _FALSE = {"true", "yes", "y"}, {"false", "no", "n"}
# names the lessons use for one thing: a guess in any of them is the measured one
_SYNONYMS = ({"fp16", "float16", "half", "fp16 (half)"}, {"bf16", "bfloat16"}, {"fp32", "float32", "single"},
             {"fp64", "float64", "double"}, {"tf32", "tensorfloat-32"})
# a leading answer, then words: "fp16, no loss scale" is fp16, "1.0 (it never moves)" is 1.0
_LEADING = re.compile(r"^\s*([^\s,;:(]+)\s*(?:[,;:(]|$)")
# A number said with its unit of comparison: "9x", "9 ×", "10 times", "12 times faster".
_TIMES = re.compile(r"^\s*([-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?)\s*(?:x|×|times)(?:\s|[,;:.]|$)", re.I)
_SHAPE = re.compile(r"^[\s(\[]*\d+(\s*[,x×*]\s*\d+)*\s*,?[\s)\]]*$")


def reveal(prediction: Any, measured: Any, what: str = "the result", *,
           factor: float | None = None, atol: float = 0.0, exact: bool = False, share: bool = False) -> None:
    """Print the prediction beside the measured value, and say whether it was well predicted:
    within 5 % for numbers (each one, for several), or within `atol` (the tolerance the next
    cell's assert uses: "zero, to rounding"); equal for a yes/no, a word (any case) or a shape,
    and word by word for several words in any sequence; for a guess of an order of magnitude
    (`factor`, e.g. 10), within that factor counts too. A prediction left as `...` is fine:
    the measured value is shown all the same. `exact`: only the measured number itself is right
    (which of two neighbours a tie goes to); `share`: the measured number is a share, and the same
    share as a fraction (0.6) or a percentage (60, "60%") is right either way (and said so).
    A one-element list is its element; a leading answer followed by words is that answer."""
    shown = _show(measured)
    if prediction is Ellipsis or prediction is None:
        print(f"No prediction written; {what} is {shown}.")
        return
    guess = _meaning(_unwrapped(prediction), measured)
    other = None  # the same share in the other form, when it is the one that matches
    if share and not _close(guess, measured, atol) and _numbers(guess) and _numbers(measured):
        other = next((g for g in (np.asarray(guess, float) * 100, np.asarray(guess, float) / 100)
                      if _close(g, measured, atol)), None)
    if exact and _numbers(guess) and _numbers(measured):
        right = np.shape(guess) == np.shape(measured) and bool(np.all(np.asarray(guess, float)
                                                                      == np.asarray(measured, float)))
        judged = "Exactly." if right else "Read on to see why (the question is which number, exactly)."
    elif _close(guess, measured, atol) or other is not None:
        judged = "Well predicted." + (" (A fraction and a percentage of the same share are the same answer.)"
                                      if other is not None else "")
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
    word = x.strip().strip("'\"").strip().rstrip(".!").strip().casefold()
    return next((min(names) for names in _SYNONYMS if word in names), word)


def _unwrapped(guess: Any) -> Any:
    """A one-element list or tuple (of anything but numbers in a shape) is its element."""
    if isinstance(guess, (list, tuple)) and len(guess) == 1 and not isinstance(guess[0], (int, np.integer)):
        return guess[0]
    if isinstance(guess, list) and len(guess) == 1:
        return guess[0]
    return guess


def _meaning(guess: Any, measured: Any) -> Any:
    """The guess read as the kind of thing that was measured, when it is typed as text."""
    if isinstance(measured, (bool, np.bool_)):
        if isinstance(guess, str) and _word(_lead(guess)) in _TRUE | _FALSE:
            return _word(_lead(guess)) in _TRUE
        return guess
    if isinstance(measured, str) and isinstance(guess, (bool, np.bool_)):  # False for "no"
        return "yes" if guess else "no"
    if isinstance(measured, str) and isinstance(guess, str) and _word(guess) != _word(measured):
        return _lead(guess)  # "fp16, no loss scale": its leading answer
    if isinstance(guess, str) and _shape(measured) and _SHAPE.match(guess):
        return tuple(int(k) for k in re.findall(r"\d+", guess))
    if isinstance(guess, str) and _numbers(measured):
        for text in (guess, _lead(guess)):
            try:
                return float(text.replace("\u2212", "-").replace(",", "").rstrip("%").strip())
            except ValueError:
                continue
        times = _TIMES.match(guess.replace("\u2212", "-"))
        if times and np.ndim(measured) == 0:  # a ratio: "9x" is 9
            return float(times.group(1).replace(",", ""))
        return guess
    return guess


def _lead(text: str) -> str:
    match = _LEADING.match(text)
    return match.group(1) if match else text


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

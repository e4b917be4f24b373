"""The exercise framework: a registry of graders, and the verdicts they print.

A lesson module (lesson01.py, ...) registers each exercise with `@exercise`: its grader, the
cell a learner would write (`solution_cell`, which is also the reference: executing it gives
`solution(id)`), and a hint. Graders raise `Wrong("...")` with the one sentence that locates
the mistake; `check` turns that into a Verdict and prints it. Nothing a learner writes can
make `check` show a traceback.
"""

from __future__ import annotations

import difflib
import math
import os
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SmallemError
from . import progress as _progress

EXPECT_SOLVED = "SMALLEM_EXPECT_SOLVED"  # =1: check raises on any answer that is not right


class Wrong(Exception):
    """Raised by a grader: the answer is wrong, and the message says where (one sentence)."""


class NotDone(Exception):
    """Raised by a grader (or `call`): the answer is still a stub."""


class ExerciseNotSolved(SmallemError):
    """Raised by `check` under SMALLEM_EXPECT_SOLVED=1 when an answer is not right."""


@dataclass(frozen=True)
class Verdict:
    """What `check` found: `ok` (right), `done` (not a stub), and the sentence it printed."""

    id: str
    ok: bool
    done: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def _ipython_display_(self) -> None:
        """`check` already printed the sentence: a notebook shows nothing more."""

    def __str__(self) -> str:
        return self.message


@dataclass
class Exercise:
    id: str
    title: str
    hint: str
    grade: Callable[[Any], str | None]  # raises Wrong/NotDone, or returns a detail for "right"
    solution_cell: str  # the filled-in exercise cell, exactly as a learner would write it
    answer: str | tuple[str, ...]  # the name(s) the cell defines: what check() receives
    env: dict[str, Any]  # the notebook's names that the cell uses (np and math are always in)

    def solution(self) -> Any:
        namespace = {"np": np, "math": math, **self.env}
        exec(compile(self.solution_cell, f"<solution {self.id}>", "exec"), namespace)  # noqa: S102
        if isinstance(self.answer, tuple):
            return tuple(namespace[name] for name in self.answer)
        return namespace[self.answer]


EXERCISES: dict[str, Exercise] = {}


def exercise(id: str, *, title: str, hint: str, solution_cell: str,
             answer: str | tuple[str, ...], env: dict[str, Any] | None = None) -> Callable:
    """Register the decorated grader `grade(answer)` as exercise `id` ("04.central_difference")."""

    def register(grade: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        if id in EXERCISES:
            raise SmallemError(f"exercise {id!r} is registered twice")
        EXERCISES[id] = Exercise(id, title, hint, grade, textwrap.dedent(solution_cell).strip() + "\n",
                                 answer, dict(env or {}))
        return grade

    return register


def _get(exercise_id: str) -> Exercise:
    if exercise_id not in EXERCISES:
        close = difflib.get_close_matches(exercise_id, EXERCISES, n=1)
        raise SmallemError(f"there is no exercise {exercise_id!r}"
                           + (f": did you mean {close[0]!r}?" if close else ""))
    return EXERCISES[exercise_id]


def grade(exercise_id: str, answer: Any) -> Verdict:
    """The verdict on `answer`, without printing it."""
    ex = _get(exercise_id)
    not_done = (f"{ex.id} is not done yet: fill in the exercise cell and run it, then run this "
                f"cell again; run show_solution('{ex.id}') to see one.")
    if unfinished(answer):
        return Verdict(ex.id, False, False, not_done)
    try:
        detail = ex.grade(answer)
    except NotDone:
        return Verdict(ex.id, False, False, not_done)
    except Wrong as wrong:
        return Verdict(ex.id, False, True, f"✗ {ex.id} not right yet: {wrong} Hint: {ex.hint}")
    except Exception as error:  # noqa: BLE001  (an answer of an unexpected kind: say so, calmly)
        return Verdict(ex.id, False, True, f"✗ {ex.id}: your answer could not be graded, "
                                           f"{_error(error)}. Hint: {ex.hint}")
    return Verdict(ex.id, True, True, f"✓ {ex.id} right: {detail or ex.title}.")


def check(exercise_id: str, answer: Any) -> Verdict:
    """Grade `answer`, print the one-sentence verdict, and return it. Under
    SMALLEM_EXPECT_SOLVED=1, an answer that is not right raises ExerciseNotSolved."""
    verdict = grade(exercise_id, answer)
    print(verdict.message)
    if verdict.done:  # a verdict earned is kept (with the answer's source when right); a stub is not
        _progress.record(verdict.id, verdict.ok, _progress.source_of(answer) if verdict.ok else None)
    if os.environ.get(EXPECT_SOLVED) == "1" and not verdict.ok:
        raise ExerciseNotSolved(verdict.message)
    return verdict


def use(exercise_id: str, answer: Any) -> Any:
    """`answer` when it is right, otherwise the package's reference, so the lesson goes on."""
    if check(exercise_id, answer).ok:
        return answer
    print("  The lesson goes on with the package's reference answer.")
    return solution(exercise_id)


def progress() -> _progress.Progress:
    """Each lesson's exercises, passed (✓), tried (✗) or to do (·), and where that is kept."""
    return _progress.table(list(EXERCISES))


def solution(exercise_id: str) -> Any:
    """The reference answer of an exercise: what its solution cell defines."""
    return _get(exercise_id).solution()


def show_solution(exercise_id: str) -> None:
    """Print the filled-in exercise cell."""
    print(_get(exercise_id).solution_cell, end="")


def reveal(prediction: Any, measured: Any, what: str = "the result", *,
           factor: float | None = None) -> None:
    """The second half of "predict, then run": print the guess beside the measured value.
    A prediction left as `...` is fine: the measured value is shown all the same. A number
    within 5 % counts as well predicted, or within `factor` for a guess of an order of magnitude."""
    shown = _show(measured)
    if unfinished(prediction):
        print(f"No prediction written; {what} is {shown}.")
    elif factor and _numeric(prediction) and _numeric(measured) and prediction * measured > 0 and \
            1 / factor <= prediction / measured <= factor:
        print(f"You predicted {_show(prediction)}; {what} is {shown}. Right order of magnitude.")
    elif _close(prediction, measured):
        print(f"You predicted {_show(prediction)}; {what} is {shown}. Well predicted.")
    else:
        print(f"You predicted {_show(prediction)}; {what} is {shown}. Read on to see why.")


# -- helpers for graders ------------------------------------------------------------------


def unfinished(x: Any) -> bool:
    """A stub: `...`, None, or a tuple/list holding one."""
    if x is Ellipsis or x is None:
        return True
    return isinstance(x, (tuple, list)) and any(unfinished(v) for v in x)


def _error(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}" + (f" ({text[0][:160]})" if text else "")


def call(fn: Any, *args: Any, on: str = "", what: str = "your function",
         returns: bool = True) -> Any:
    """Call the learner's function; a stub raises NotDone, an error becomes a Wrong.
    `returns=False` for a function that works in place (its None is not a stub)."""
    if not callable(fn):
        raise Wrong(f"this exercise wants a function, and got {type(fn).__name__} {_show(fn)}.")
    try:
        with np.errstate(all="ignore"):  # an inf or nan is reported by the grader, in words
            out = fn(*args)
    except NotImplementedError:
        raise NotDone from None
    except Exception as error:  # noqa: BLE001
        raise Wrong(f"{what} raised {_error(error)}" + (f" on {on}." if on else ".")) from None
    if returns and unfinished(out):
        raise NotDone
    return out


def number(x: Any, name: str) -> float:
    """A learner's scalar answer as a float, or a Wrong saying what it was instead."""
    try:
        value = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise Wrong(f"{name} should be a number, got {type(x).__name__} {_show(x)}.") from None
    if value.size != 1:
        raise Wrong(f"{name} should be one number, got an array of shape {list(value.shape)}.")
    return float(value.reshape(()))


def fmt(x: Any, limit: int = 6) -> str:
    """A short, one-line printout of a number or a small array: 4 significant digits."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        return f"{float(a):.4g}"
    if a.ndim == 1:
        flat = ", ".join(f"{v:.4g}" for v in a[:limit])
        return f"[{flat}{', …' if a.size > limit else ''}]"
    if a.size <= 2 * limit:
        return "[" + ", ".join(fmt(row, limit) for row in a) + "]"
    return f"an array of shape {list(a.shape)}"


def describe(**inputs: Any) -> str:
    """"a = [0.5, -1.2], b = 3" for the input of a wrong answer."""
    return ", ".join(f"{k} = {fmt(v) if _numeric(v) else v}" for k, v in inputs.items())


def compare(name: str, got: Any, want: Any, *, on: str = "", source: str = "it should be",
            tolerance: float = 1e-6, shape_hint: str = "") -> float:
    """Raise Wrong naming the worst element of `got` unless it matches `want` to a relative
    error of `tolerance` on the scale max(|got|, |want|, 1) (gradcheck's scale). Returns the
    largest error."""
    where = f", on {on}" if on else ""
    try:
        g = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        raise Wrong(f"{name} should be an array of numbers, got {type(got).__name__}{where}.") from None
    w = np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        raise Wrong(f"{name} has shape {list(g.shape)} where it should be {list(w.shape)}"
                    f"{where}{'; ' + shape_hint if shape_hint else ''}.")
    if g.size == 0:
        return 0.0
    if not np.all(np.isfinite(g)):
        i = tuple(int(k) for k in np.argwhere(~np.isfinite(g))[0])
        raise Wrong(f"{name}{_index(i, g)} is {g[i]} where {source} {fmt(w[i])}{where}.")
    err = np.abs(g - w) / np.maximum(np.maximum(np.abs(g), np.abs(w)), 1.0)
    i = np.unravel_index(int(np.argmax(err)), err.shape)
    if err[i] > tolerance:
        raise Wrong(f"{name}{_index(i, g)} is {fmt(g[i])} where {source} {fmt(w[i])} (off by "
                    f"{abs(g[i] - w[i]):.3g}){where}.")
    return float(err.max())


def _index(i: tuple, a: np.ndarray) -> str:
    return "" if a.ndim == 0 else "[" + ", ".join(str(int(k)) for k in i) + "]"


def _numeric(x: Any) -> bool:
    return isinstance(x, (int, float, np.number, np.ndarray)) and not isinstance(x, bool)


def _show(x: Any) -> str:
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if _numeric(x):
        return fmt(x)
    if isinstance(x, (tuple, list)) and all(_numeric(v) for v in x):
        return "(" + ", ".join(fmt(v) for v in x) + ")"
    return repr(x)


def _close(guess: Any, measured: Any, rel: float = 0.05) -> bool:
    """A guess within 5 % (or 0.01 for numbers near zero) counts as well predicted."""
    if isinstance(measured, (bool, np.bool_)) or isinstance(guess, (bool, np.bool_)):
        return bool(guess) == bool(measured)
    try:
        g = np.asarray(guess, dtype=np.float64)
        m = np.asarray(measured, dtype=np.float64)
        return g.shape == m.shape and bool(np.all(np.abs(g - m) <= np.maximum(rel * np.abs(m), 0.01)))
    except (TypeError, ValueError):
        return guess == measured


def cases(seed: int, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Random inputs with |x| in [0.5, 2] (away from zero, safe to divide by), one per shape."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.5, 2.0, size=s) * rng.choice([-1.0, 1.0], size=s) for s in shapes]


def grade_rule(answer: Any, op: str, tape_fn: Callable, inputs: Sequence[np.ndarray],
               names: Sequence[str], args: tuple = (), seed: int = 0) -> float:
    """Grade a local rule `answer(be, grad, out, *inputs, *args) -> (d_input, ...)` against
    central differences (smallem.autodiff.gradcheck) of the forward `tape_fn(tape, *vars)`, with a
    random incoming gradient. Returns the largest relative error."""
    from ..autodiff.gradcheck import check_gradients, output_weights
    from ..autodiff.tape import Tape
    from ..backends import get_backend

    be = get_backend("cpu64")
    tape = Tape(be)
    out = tape_fn(tape, *[tape.constant(x) for x in inputs])
    tape.close()
    grad = output_weights(out.shape, seed)  # the incoming gradient dc: random, all different
    numeric = check_gradients(tape_fn, inputs, weights=grad).numeric
    on = describe(**dict(zip(names, inputs)), dc=grad) + (f", args {args}" if args else "")
    result = call(answer, be, np.array(grad), np.array(be.to_numpy(out.value)),
                  *[np.array(x) for x in inputs], *args, on=on, what=f"your {op} rule")
    if not isinstance(result, (tuple, list)) or len(result) != len(inputs):
        kind = type(result).__name__
        got = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}" if not isinstance(result, (tuple, list)) else \
            f"{len(result)} value(s)"
        raise Wrong(f"a rule returns a tuple with one gradient per input, here "
                    f"({', '.join('d' + n for n in names)}{',' if len(names) == 1 else ''}), "
                    f"and yours returned {got}.")
    return max(compare(f"d{name}", got, want, on=on, source="finite differences give")
               for name, got, want in zip(names, result, numeric))

"""The tools a lesson's grader grades with: call the learner's function, read a number, compare
arrays element by element and name the worst one, grade a local rule against finite differences;
and the stub detection (`blank`, `unfinished`) that tells "not done" from "wrong". A grader raises
`Wrong` with one sentence; grading.py turns it into the verdict.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import fmt
from .predict import _numeric, _show


class Wrong(Exception):
    """Raised by a grader: the answer is wrong, and the message says where (one sentence)."""


class NotDone(Exception):
    """Raised by a grader (or `call`): the answer is still a stub."""


def off_by(difference: float) -> str:
    """How a verdict says two numbers differ, in the graders and lesson 09's by-hand comparison:
    "off by 0.0216"."""
    return f"off by {fmt(difference, 3)}"


def holds_itself(x: Any, inside: frozenset[int] = frozenset()) -> bool:
    """A tuple/list/dict that contains itself, at any depth (`a = []; a.append(a)`)."""
    if not isinstance(x, (tuple, list, dict)):
        return False
    if id(x) in inside:
        return True
    inside = inside | {id(x)}
    return any(holds_itself(v, inside) for v in (x.values() if isinstance(x, dict) else x))


def unfinished(x: Any) -> bool:
    """A stub: `...`, None, or a tuple/list holding one (one that holds itself is not a stub)."""
    if x is Ellipsis or x is None:
        return True
    return isinstance(x, (tuple, list)) and not holds_itself(x) and any(unfinished(v) for v in x)


def blank(fn: Any) -> bool:
    """A function still as its exercise cell gave it: a body of a docstring, `...`, `pass`,
    `raise NotImplementedError`, `name = ...` and a `return` of names it was given or left as
    `...` (06.adamw_step's stub returns its inputs). Read from the source; False when unreadable.
    A pair of functions (11.split_heads) is blank while either of them is."""
    if isinstance(fn, (tuple, list)):
        return not holds_itself(fn) and any(blank(f) for f in fn)
    if not callable(fn):
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except Exception:  # noqa: BLE001  (no source to read: the answer is graded as it runs)
        return False
    name = getattr(fn, "__name__", "")
    if name == "<lambda>":
        node = next((n for n in ast.walk(tree) if isinstance(n, ast.Lambda)), None)
    else:
        node = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == name), None)
    if node is None:
        return False
    a = node.args
    given = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x}
    # A stub may return its inputs untouched (06.adamw_step's `return p, m, v`), but only after
    # a visible `...`: `def f(grad, shape): return grad` is an answer, wrong or not.
    placeholders: set[str] = set()  # names the stub left as `...`
    seen_stub = False  # a `...`, `pass` or NotImplementedError: the body is still to be written

    def inert(e: ast.expr | None, names: set[str]) -> bool:
        if e is None or isinstance(e, ast.Constant) and e.value in (None, Ellipsis):
            return True
        if isinstance(e, (ast.Tuple, ast.List)):
            return all(inert(v, names) for v in e.elts)
        return isinstance(e, ast.Name) and e.id in names

    if isinstance(node, ast.Lambda):
        return inert(node.body, set())
    for stmt in node.body:
        value = stmt.value if isinstance(stmt, ast.Expr) else None
        if isinstance(stmt, ast.Pass) or isinstance(value, ast.Constant) and value.value is Ellipsis:
            seen_stub = True
        elif isinstance(value, ast.Constant) and isinstance(value.value, str):
            continue  # the docstring
        elif isinstance(stmt, ast.Raise) and "NotImplementedError" in ast.unparse(stmt):
            seen_stub = True
        elif (isinstance(stmt, ast.Assign) and inert(stmt.value, set())
              and all(isinstance(t, ast.Name) for t in stmt.targets)):
            placeholders |= {t.id for t in stmt.targets}  # `dW1 = ...`: still to fill in
        elif isinstance(stmt, ast.Return):
            return inert(stmt.value, placeholders | (given if seen_stub else set()))
        else:
            return False
    return True


def parts(out: Any, count: int, what: str) -> list:
    """The `count` values of a pair or triple the learner returned, as any sequence (tuple,
    list, array); a Wrong saying `what` should come back otherwise."""
    if (isinstance(out, (str, bytes)) or not isinstance(out, (Sequence, np.ndarray))
            or isinstance(out, np.ndarray) and out.ndim == 0):
        kind = type(out).__name__
        raise Wrong(f"{what}, and got {'an' if kind[0] in 'aeiou' else 'a'} {kind}.")
    if len(out) != count:
        raise Wrong(f"{what}, and got {len(out)} value{'s' if len(out) != 1 else ''}.")
    return [out[k] for k in range(count)]


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
    if returns and out is None:
        raise Wrong(f"{what} returned None (forgot `return`?)" + (f" on {on}." if on else "."))
    if returns and unfinished(out):
        raise NotDone  # a `...` still in what it returns: not finished yet
    return out


def number(x: Any, name: str) -> float:
    """A learner's scalar answer as a float, or a Wrong saying what it was instead."""
    if isinstance(x, (str, bytes, bool, np.bool_)):
        raise Wrong(f"{name} should be a number, got {type(x).__name__} {x!r}"
                    + ("; write the number without quotes." if isinstance(x, str) else "."))
    try:
        value = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise Wrong(f"{name} should be a number, got {type(x).__name__} {_show(x)}.") from None
    if value.size != 1:
        raise Wrong(f"{name} should be one number, got an array of shape {list(value.shape)}.")
    return float(value.reshape(()))


def describe(**inputs: Any) -> str:
    """"a = [0.5, -1.2], b = 3" for the input of a wrong answer."""
    return ", ".join(f"{k} = {fmt(v) if _numeric(v) else v}" for k, v in inputs.items())


def differing(a: float, b: float) -> tuple[str, str]:
    """Two numbers written with just enough digits (4 at least) for the printouts to differ."""
    for digits in range(4, 18):
        if fmt(a, digits) != fmt(b, digits):
            break
    return fmt(a, digits), fmt(b, digits)


def compare(name: str, got: Any, want: Any, *, on: str = "", source: str = "it should be",
            tolerance: float = 1e-6, shape_hint: str = "", floor: float = 1.0) -> float:
    """Raise Wrong naming the worst element of `got` unless it matches `want` to a relative
    error of `tolerance` on the scale max(|got|, |want|, floor) (gradcheck's, with floor 1; a
    tiny floor judges tiny numbers relatively too). Returns the largest error."""
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
        raise Wrong(f"{name}{_index(i, g)} is {g[i]} where {source} {fmt(w[i], 6)}{where}.")
    err = np.abs(g - w) / np.maximum(np.maximum(np.abs(g), np.abs(w)), floor)
    i = np.unravel_index(int(np.argmax(err)), err.shape)
    if err[i] > tolerance:
        mine, theirs = differing(g[i], w[i])
        raise Wrong(f"{name}{_index(i, g)} is {mine} where {source} {theirs} "
                    f"({off_by(abs(g[i] - w[i]))}){where}.")
    return float(err.max())


def _index(i: tuple, a: np.ndarray) -> str:
    return "" if a.ndim == 0 else "[" + ", ".join(str(int(k)) for k in i) + "]"


def cases(seed: int, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Random inputs with |x| in [0.5, 2] (away from zero, safe to divide by), one per shape."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.5, 2.0, size=s) * rng.choice([-1.0, 1.0], size=s) for s in shapes]


def grade_rule(answer: Any, op: str, tape_fn: Callable, inputs: Sequence[np.ndarray],
               names: Sequence[str], args: tuple = (), seed: int = 0) -> float:
    """Grade a local rule `answer(be, grad, out, *inputs, *args) -> (d_input, ...)` against
    central differences (smallem.autodiff.gradcheck) of the forward `tape_fn(tape, *vars)`, with a
    random incoming gradient. Returns the largest relative error."""
    from ...autodiff.gradcheck import check_gradients, output_weights
    from ...autodiff.tape import Tape
    from ...backends import get_backend

    be = get_backend("cpu64")
    tape = Tape(be)
    out = tape_fn(tape, *[tape.constant(x) for x in inputs])
    tape.close()
    grad = output_weights(out.shape, seed)  # the incoming gradient dc: random, all different
    numeric = check_gradients(tape_fn, inputs, weights=grad).numeric
    on = describe(**dict(zip(names, inputs)), dc=grad) + (f", args {args}" if args else "")
    result = call(answer, be, np.array(grad), np.array(be.to_numpy(out.value)),
                  *[np.array(x) for x in inputs], *args, on=on, what=f"your {op} rule")
    result = parts(result, len(inputs), f"a rule returns a tuple with one gradient per input, here "
                   f"({', '.join('d' + n for n in names)}{',' if len(names) == 1 else ''})")
    return max(compare(f"d{name}", got, want, on=on, source="finite differences give")
               for name, got, want in zip(names, result, numeric))

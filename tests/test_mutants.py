"""Graders tested by mutants: every exercise's solution cell is mutated one small change at a time
(tests/mutants.py: an operator swapped, a constant or an axis off by one, a term dropped, arguments
or outputs reordered, a rounding swapped, a guard or a statement removed), each mutant is run on
the exercise's inputs, and every mutant whose output differs from the solution's must be refused
by the grader. The inputs are the ones the grader itself hands the solution (recorded) and, where
the lesson feeds the answer its own data, that data (`LESSON` below). A mutant whose output equals
the solution's on all of them is equivalent there (each listed with why in mutants_equivalent.py,
and printed); one that never finishes (2 s) or fails in its own cell never reaches a grader
(counted apart). Each exercise's mutation score is printed; under 100 % of the differing mutants
refused, the test fails. Every mutant is run: none of the 40 has more than CAP."""

from __future__ import annotations

import copy
import functools
import linecache
import math
import signal
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from course import exercise_ids
from mutants import Mutant, mutants
from mutants_equivalent import EQUIVALENT

from smallem.course import EXERCISES, grade

CAP = 120  # mutants per exercise at most: every k-th of the list, a fixed choice (the most, 115, are all run)
SECONDS = 2.0  # a mutant running longer on one input is taken as never finishing (a `while` off by one)
TOLERANCE = 1e-6  # outputs within this (relative to the larger) are the same output
EXACT = {"14.to_bf16"}  # bits: any difference at all is another output


class _Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang


def _run(fn: Callable, args: tuple) -> Any:
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, SECONDS)
    try:
        with np.errstate(all="ignore"):
            return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _copy(x: Any) -> Any:
    try:
        return copy.deepcopy(x)
    except Exception:  # noqa: BLE001  (a backend or a tape: handed on as it is)
        return x


def _plain(x: Any) -> Any:
    """An answer's output as nested lists of float64 arrays, for comparing."""
    if hasattr(x, "value") and hasattr(x, "shape") and not isinstance(x, np.ndarray):
        x = x.value  # a Var of the tape
    if isinstance(x, dict):
        return {"dict": sorted((repr(k), _plain(v)) for k, v in x.items())}
    if isinstance(x, (tuple, list)):
        return [_plain(v) for v in x]
    if isinstance(x, (bytes, str)) or x is None:
        return x
    try:
        a = np.asarray(x)
        return a.astype(np.float64) if a.dtype != object else repr(x)
    except Exception:  # noqa: BLE001
        return repr(x)


def _differ(a: Any, b: Any, tolerance: float = TOLERANCE) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) != len(b) or any(_differ(x, y, tolerance) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return _differ(a["dict"], b["dict"], tolerance)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if a.shape != b.shape:
            return True
        if a.size == 0:
            return False
        nan = np.isnan(a) | np.isnan(b)
        if not np.array_equal(np.isnan(a), np.isnan(b)) or not np.array_equal(np.isinf(a), np.isinf(b)):
            return True
        if not np.array_equal(a[np.isinf(a)], b[np.isinf(a)]):  # +inf against -inf
            return True
        finite = ~nan & ~np.isinf(a)
        if not finite.any():
            return False
        scale = max(np.abs(a[finite]).max(), np.abs(b[finite]).max(), 1e-300)
        return bool(np.abs(a[finite] - b[finite]).max() > tolerance * scale)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return True
    return a != b


# -- the lesson's own data, for the exercises whose answer the lesson uses beyond the grader ---

@functools.cache
def _lesson16_text() -> tuple[Any, Any]:
    from smallem.data import load_corpus
    corpus = load_corpus()
    return bytes(corpus.train[:60_000].astype(np.uint8)), bytes(corpus.held_out[:20_000].astype(np.uint8))


def _merge_rule_lesson(answer: Any) -> Any:
    from smallem import tokens as T
    count_pairs, merge = answer
    train, _ = _lesson16_text()
    return T.train(T.word_counts(train), 400, count=lambda w: dict(count_pairs(w)), rewrite=merge)


@functools.cache
def _lesson16_tokenizer() -> tuple[Any, list[bytes]]:
    from smallem import tokens as T
    train, held = _lesson16_text()
    return T.Tokenizer(T.train(T.word_counts(train), 400)), sorted(set(T.chunks(held)))[:600]


def _encode_lesson(answer: Any) -> Any:
    tokenizer, chunks = _lesson16_tokenizer()
    return [list(answer(chunk, dict(tokenizer.rank))) for chunk in chunks]


def _attention_bytes_lesson(answer: Any) -> Any:
    # as notebook 15 calls it (itemsize left out, then given), on shapes where B·T·C ≠ B·H·T·T
    return [answer(2, 64, 128, 4), answer(1, 4096, 128, 4), answer(2, 16, 8, 2, 4), answer(3, 5, 6, 2)]


def _cached_step_lesson(answer: Any) -> Any:
    rng = np.random.default_rng(16)  # scores of a few hundred, as a trained model's can be
    q, k, v = (rng.normal(size=(2, 4, 1, 16)) * 30, rng.normal(size=(2, 4, 9, 16)) * 30,
               rng.normal(size=(2, 4, 9, 16)))
    return answer(q, k, v)


def _online_update_lesson(answer: Any) -> Any:
    # a row whose running max is still -inf (every score of the row masked so far), and one that is not
    m = np.array([[-np.inf], [0.5]])
    l_, acc = np.array([[0.0], [2.0]]), np.array([[0.0, 0.0], [1.0, -1.0]])
    s = np.array([[-np.inf, -np.inf], [0.3, -0.2]])
    v = np.array([[1.0, 2.0], [3.0, 4.0]])
    return answer(m, l_, acc, s, v)


def _to_bf16_lesson(answer: Any) -> Any:
    from smallem.course.l14_precision.exercises import _nan_patterns
    x = np.array([np.pi, 1 / 3, 1 + 2 ** -8, 65504.0, -1e-30], np.float32)  # notebook 14's own numbers
    return [answer(x), answer(_nan_patterns())]


LESSON: dict[str, Callable[[Any], Any]] = {
    "14.to_bf16": _to_bf16_lesson,
    "16.merge_rule": _merge_rule_lesson, "16.encode": _encode_lesson,
    "15.attention_bytes": _attention_bytes_lesson, "16.cached_step": _cached_step_lesson,
    "15.online_update": _online_update_lesson,
}


# -- recording what the grader hands the solution ------------------------------------------------

def _recorded_calls(exercise_id: str) -> list[tuple[int, tuple]]:
    """(which function of the answer, its arguments) for every call the grader makes on the solution."""
    ex = EXERCISES[exercise_id]
    right = ex.solution()
    calls: list[tuple[int, tuple]] = []

    def spy(k: int, fn: Callable) -> Callable:
        def wrapped(*args: Any) -> Any:
            calls.append((k, tuple(_copy(a) for a in args)))
            return fn(*args)
        return wrapped

    if isinstance(right, tuple) and all(callable(f) for f in right):
        grade(exercise_id, tuple(spy(k, f) for k, f in enumerate(right)))
    elif callable(right):
        grade(exercise_id, spy(0, right))
    return calls


def _output(exercise_id: str, answer: Any, calls: list[tuple[int, tuple]]) -> Any:
    """What the answer gives on the grader's inputs and the lesson's data (an error's type stands
    for its output)."""
    def one(fn: Callable, args: tuple) -> Any:
        try:
            args = tuple(_copy(a) for a in args)
            out = _run(fn, args)
            return [_plain(out), _plain([a for a in args if isinstance(a, (np.ndarray, list, dict))])]
        except _Hang:
            raise
        except Exception as error:  # noqa: BLE001
            return f"raised {type(error).__name__}"

    if not callable(answer) and not (isinstance(answer, tuple) and all(callable(f) for f in answer)):
        return [_plain(answer)]
    fns = answer if isinstance(answer, tuple) else (answer,)
    found = [one(fns[k], args) for k, args in calls]
    if exercise_id in LESSON:
        found.append(one(LESSON[exercise_id], (answer,)))
    return found


def _define(exercise_id: str, source: str) -> Any:
    filename = f"<mutant of {exercise_id}>"  # readable source, as a notebook cell's is (blank reads it)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ex = EXERCISES[exercise_id]
    namespace = {"np": np, "math": math, **ex.env}
    _run(lambda: exec(compile(source, filename, "exec"), namespace), ())  # noqa: S102
    names = ex.answer
    return tuple(namespace[n] for n in names) if isinstance(names, tuple) else namespace[names]


def mutation_report(exercise_id: str) -> dict[str, list[str]]:
    ex = EXERCISES[exercise_id]
    every = mutants(ex.solution_cell)
    chosen: list[Mutant] = every[::math.ceil(len(every) / CAP)] if len(every) > CAP else every
    calls = _recorded_calls(exercise_id)
    want = _output(exercise_id, ex.solution(), calls)
    report: dict[str, list[str]] = {"refused": [], "accepted": [], "equivalent": [], "hangs": [],
                                    "fails in its cell": []}
    for mutant in chosen:
        try:
            answer = _define(exercise_id, mutant.source)
        except _Hang:
            report["hangs"].append(mutant.what)
            continue
        except Exception:  # noqa: BLE001  (the learner's cell itself stops: no grader sees it)
            report["fails in its cell"].append(mutant.what)
            continue
        try:
            got = _output(exercise_id, answer, calls)
        except _Hang:
            report["hangs"].append(mutant.what)
            continue
        if not _differ(got, want, 0.0 if exercise_id in EXACT else TOLERANCE):
            report["equivalent"].append(mutant.what)
            continue
        try:
            verdict = _run(lambda: grade(exercise_id, answer), ())
        except _Hang:
            report["hangs"].append(mutant.what)
            continue
        report["refused" if not verdict.ok else "accepted"].append(mutant.what)
    return report


@pytest.mark.parametrize("exercise_id", exercise_ids())
def test_the_grader_refuses_every_mutant_whose_output_differs(exercise_id, capsys):
    report = mutation_report(exercise_id)
    differing = len(report["refused"]) + len(report["accepted"])
    score = len(report["refused"]) / differing if differing else 1.0
    with capsys.disabled():
        print(f"\n{exercise_id}: mutation score {score:.0%} ({len(report['refused'])} of {differing} "
              f"differing mutants refused; {len(report['equivalent'])} equivalent on its inputs, "
              f"{len(report['hangs'])} never finish, {len(report['fails in its cell'])} fail in their cell)")
    for what in report["equivalent"]:
        print(f"  equivalent: {what}: {EQUIVALENT.get((exercise_id, what), 'NOT EXPLAINED')}")
    assert not report["accepted"], f"{exercise_id}: the grader accepts mutants whose output differs: " \
                                    + "; ".join(report["accepted"])
    unexplained = [what for what in report["equivalent"] if (exercise_id, what) not in EQUIVALENT]
    assert not unexplained, (f"{exercise_id}: mutants with the solution's output on every input, not listed "
                             f"in EQUIVALENT with why (or a grader input to add): {unexplained}")

"""Lesson 14, what a float can hold: rounding a float32 to bf16 by its bits (graded against
ml_dtypes), the dynamic loss scaler's rule (graded against backends/precision.LossScaler, then
used by the lesson's own fp16 run) and the float32 master-weight update."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ...backends.precision import LossScaler
from ..common.graders import Wrong, call, compare, parts
from ..common.grading import exercise


def bf16_reference(x: Any) -> np.ndarray:
    """ml_dtypes' bfloat16 of x, back in float32: the truth the exercise is graded against."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def _nan_patterns() -> np.ndarray:
    """±inf and NaNs whose mantissa bits sit in either half: low bits only round up to the exponent
    (inf), high bits all ones carry into the sign (0x7FFFFFFF) or past it (0xFFFFFFFF)."""
    mantissas = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x10000, 0x18000, 0x3FFFFF, 0x400000,
                          0x7F8000, 0x7FFF00, 0x7FFFFF], np.uint32)
    bits = np.concatenate([0x7F800000 | mantissas, 0xFF800000 | mantissas]).astype(np.uint32)
    return bits.view(np.float32)


# -- 14.to_bf16 ---------------------------------------------------------------------------------

@exercise("14.to_bf16", title="a float32 rounded to bf16 by its bits, to nearest, ties to even",
          hints=("bf16 is the top 16 bits of a float32: sign, the same 8 exponent bits, 7 of the 23 "
                 "mantissa bits. x.view(np.uint32) gives the bits as an integer; & 0xFFFF0000 keeps "
                 "the top 16 (that is truncation, rounding towards zero).",
                 "To round to nearest, add half of the dropped range, 0x8000, before cutting. A tie "
                 "(dropped bits exactly 0x8000) must go to the even neighbour: add 0x7FFF plus the "
                 "lowest kept bit, (u >> 16) & 1.",
                 "u = x.view(np.uint32); r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000; a NaN "
                 "first, as its bits would carry: r = np.where(np.isnan(x), u | 0x7FC00000, r); "
                 "return r.astype(np.uint32).view(np.float32)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "truncation": (lambda x: (x.view(np.uint32) & 0xFFFF0000).astype(np.uint32).view(np.float32),
                             "rounds towards zero"),
              "ties away from zero": (lambda x: ((x.view(np.uint32) + 0x8000) & 0xFFFF0000)
                                      .astype(np.uint32).view(np.float32), "ties to even"),
              "no rounding at all": (lambda x: x, "ml_dtypes.bfloat16 gives"),
          },
          hint_for={"towards zero": 2, "ties": 2, "NaN": 3},
          answer="to_bf16", alternate_cell='''
# Exercise 14.to_bf16 · keep the top 16 bits of each float32, rounded to nearest, ties to even
def to_bf16(x):
    rounded = []
    for value in x:
        if np.isnan(value):                                # its bits would carry into the sign
            rounded.append(np.float32(value))
            continue
        bits = int(np.float32(value).view(np.uint32))    # one number at a time, as a Python int
        top, dropped = bits >> 16, bits & 0xFFFF
        if dropped > 0x8000 or (dropped == 0x8000 and top % 2 == 1):
            top += 1                                       # up; a tie only when that makes top even
        rounded.append(np.uint32(top << 16).view(np.float32))
    return rounded
''', solution_cell='''
# Exercise 14.to_bf16 · keep the top 16 bits of each float32, rounded to nearest, ties to even
def to_bf16(x):
    """x: a float32 array. Return float32 values that bf16 can hold; a NaN stays a NaN."""
    u = x.view(np.uint32)                        # the 32 bits as an unsigned integer
    lowest_kept = (u >> 16) & 1                  # a tie goes where this bit becomes 0
    r = (u + 0x7FFF + lowest_kept) & 0xFFFF0000  # add just under half, cut the low 16 bits
    r = np.where(np.isnan(x), u | 0x7FC00000, r)  # a NaN's bits would carry into inf, 0 or the sign
    return r.astype(np.uint32).view(np.float32)
''')
def to_bf16(answer):
    rng = np.random.default_rng(14)
    spread = (rng.standard_normal(2000) * 10.0 ** rng.uniform(-30, 30, 2000)).astype(np.float32)
    ties = ((rng.integers(0, 2 ** 16, 64, dtype=np.uint32) << 16) | 0x8000).astype(np.uint32)
    ties = ties[np.abs(ties.view(np.float32)) < 1e38].view(np.float32)  # finite, no carry to inf
    cases = [("1 + 2⁻⁸ (bf16 keeps 7 mantissa bits: exactly halfway)", np.array([1 + 2 ** -8], np.float32)),
             ("numbers spread over 60 orders of magnitude, both signs", spread),
             ("ties: the dropped 16 bits exactly 0x8000", ties)]
    for on, x in cases + [("NaN and inf bit patterns (exponent all ones)", _nan_patterns())]:
        given = x.copy()
        got = np.asarray(call(answer, given, on=on), dtype=np.float32)
        if not np.array_equal(_bits(given), _bits(x)):  # the next exercise rounds its master so
            raise Wrong(f"to_bf16 changed its input x in place ({on}): x.view(np.uint32) shares x's "
                        "memory, so += or &= on it rounds x itself; compute the rounded bits as a new "
                        "array (r = (u + ...) & 0xFFFF0000) and return its view.")
        want = bf16_reference(x)
        if got.shape != x.shape:
            raise Wrong(f"got shape {list(got.shape)} for an input of shape {list(x.shape)} ({on}).")
        if np.array_equal(got, (_bits(x) & 0xFFFF0000).view(np.float32)) and not np.array_equal(got, want):
            raise Wrong(f"this cuts the low 16 bits off, which rounds towards zero ({on}): add half "
                        "of what you drop before cutting.")
        if not np.array_equal(np.isnan(got), np.isnan(want)):
            k = int(np.argmax(np.isnan(got) != np.isnan(want)))
            raise Wrong(f"the NaN of bits {int(_bits(x)[k]):08x} becomes {got[k]} ({on}): adding to a NaN's "
                        "bits carries into the exponent or the sign, giving inf or 0; keep a NaN a NaN "
                        "(np.where(np.isnan(x), ...), as ml_dtypes and PyTorch check it first).")
        if np.isnan(want).any():  # any NaN is right; the others, and ±inf, bit for bit
            keep = ~np.isnan(want)
            if not np.array_equal(_bits(got[keep]), _bits(want[keep])):
                k = int(np.argmax(_bits(got[keep]) != _bits(want[keep])))
                raise Wrong(f"{x[keep][k]} becomes {got[keep][k]} where ml_dtypes.bfloat16 gives "
                            f"{want[keep][k]} ({on}).")
            continue
        up = ((_bits(x) + 0x8000) & 0xFFFF0000).astype(np.uint32).view(np.float32)
        if np.array_equal(got, up) and not np.array_equal(got, want):
            raise Wrong(f"ties go up here, away from zero ({on}): a number exactly halfway must go "
                        "to the neighbour whose last kept bit is 0 (ties to even).")
        compare("to_bf16(x)", got, want, on=on, source="ml_dtypes.bfloat16 gives", tolerance=0.0)
    return "bit for bit what ml_dtypes' bfloat16 gives, ties to even included"


# -- 14.loss_scaler -----------------------------------------------------------------------------

def _scenarios() -> list[tuple[str, float, int, list[bool], int]]:
    return [("an overflow at the first step", 1024.0, 0, [False], 3),
            ("three clean steps with interval 3", 1024.0, 0, [True, True, True], 3),
            ("clean, clean, overflow, then three clean", 2.0 ** 16, 0,
             [True, True, False, True, True, True], 3),
            ("two overflows in a row", 8.0, 2, [False, False], 5)]


def _grow(scale: float, clean: int, interval: int) -> tuple[bool, float, int]:
    """A clean step, rightly counted (the planted rules below differ on overflow only)."""
    return (True, scale * 2, 0) if clean + 1 == interval else (True, scale, clean + 1)


def _no_halving(scale, clean, finite, interval):  # planted: skips, but keeps the scale
    return (False, scale, 0) if not finite else _grow(scale, clean, interval)


def _applies_anyway(scale, clean, finite, interval):  # planted: halves, but applies the step
    return True, scale / 2 if not finite else scale, 0


def _count_kept(scale, clean, finite, interval):  # planted: the clean count survives an overflow
    return (False, scale / 2, clean) if not finite else _grow(scale, clean, interval)


@exercise("14.loss_scaler",
          title="the dynamic loss scaler: skip and halve on overflow, double after N clean steps",
          hints=("Two cases. Overflow (finite is False): the step must not be applied, the scale "
                 "halves, and the count of clean steps starts again from 0.",
                 "A clean step is applied and counted; when the count reaches `interval`, the scale "
                 "doubles and the count goes back to 0.",
                 "if not finite: return False, scale / 2, 0; clean += 1; if clean == interval: "
                 "return True, scale * 2, 0; return True, scale, clean."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "no halving": (_no_halving, "must halve"),
              "applies an overflowed step": (_applies_anyway, "must be skipped"),
              "count not reset on overflow": (_count_kept, "clean count"),
          },
          answer="scaler_update", alternate_cell='''
# Exercise 14.loss_scaler · one step's verdict: (apply the update?, the new scale, the new count)
def scaler_update(scale, clean, finite, interval):
    if not finite:
        return [False, scale * 0.5, 0]
    clean = (clean + 1) % interval          # back to 0 on the step that reaches the interval
    return [True, scale * 2 if clean == 0 else scale, clean]
''', solution_cell='''
# Exercise 14.loss_scaler · one step's verdict: (apply the update?, the new scale, the new count)
def scaler_update(scale, clean, finite, interval):
    """scale: the loss scale; clean: clean steps in a row so far; finite: no inf/NaN in this
    step's gradients; interval: clean steps before the scale grows. Return (apply, scale, clean)."""
    if not finite:                  # an overflow: skip this step, halve, start counting again
        return False, scale / 2, 0
    clean += 1                      # a clean step: applied, and counted
    if clean == interval:           # long enough without overflow: try a larger scale
        return True, scale * 2, 0
    return True, scale, clean
''')
def loss_scaler(answer):
    for on, scale, clean, verdicts, interval in _scenarios():
        ref = LossScaler(scale=scale, interval=interval, clean=clean)
        s, c = scale, clean
        for k, finite in enumerate(verdicts):
            applied = ref.update(finite)
            out = parts(call(answer, s, c, finite, interval, on=on), 3, "(apply, scale, clean)")
            if bool(out[0]) != applied:
                should = ("must be skipped: its gradients overflowed" if not finite
                          else "is clean and must be applied")
                raise Wrong(f"step {k + 1} of «{on}» {should}, but your rule says apply={bool(out[0])}.")
            if not finite and float(out[1]) == s and bool(out[0]) is False:
                raise Wrong(f"step {k + 1} of «{on}» overflowed and was skipped, but the scale stayed "
                            f"{s:g}: it must halve, or the next step overflows again.")
            compare(f"the scale after step {k + 1}", float(out[1]), ref.scale, on=on, tolerance=0.0,
                    source="the rule gives")
            compare(f"the clean count after step {k + 1}", float(out[2]), float(ref.clean), on=on,
                    tolerance=0.0, source="the rule gives")
            s, c = float(out[1]), int(out[2])
    return "skips and halves on overflow, doubles after `interval` clean steps, as LossScaler does"


class RuleScaler(LossScaler):
    """A LossScaler whose rule is the learner's `scaler_update` (the lesson's fp16 run uses it)."""

    def __init__(self, rule: Any, scale: float = 2.0 ** 16, interval: int = 200) -> None:
        super().__init__(scale=scale, interval=interval)
        self.rule = rule

    def update(self, finite: bool) -> bool:
        applied, self.scale, self.clean = self.rule(self.scale, self.clean, finite, self.interval)
        self.skipped += not applied
        return bool(applied)


# -- 14.master_update ---------------------------------------------------------------------------

@exercise("14.master_update", title="the master-weight update: float32 weights, a bf16 copy for the products",
          hints=("Two arrays come back: the float32 master weights after the step, and the copy the "
                 "matrix products read, rounded to bf16 from the new master.",
                 "Update the master in float32, master − lr·grad, and only then round: rounding first "
                 "and updating the rounded copy loses every step smaller than half a bf16 ulp.",
                 "new = (master - lr * grad).astype(np.float32); return new, to_bf16(new)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "master kept in bf16": (lambda master, grad, lr: (lambda new: (new, new))(
                  bf16_reference(bf16_reference(master) - np.float32(lr) * grad)), "must keep its float32"),
              "the copy not rounded": (lambda master, grad, lr: (lambda new: (new, new))(
                  (master - lr * grad).astype(np.float32)), "the new master rounded to bf16 gives"),
              "the two swapped": (lambda master, grad, lr: (lambda new: (bf16_reference(new), new))(
                  (master - lr * grad).astype(np.float32)), "the two are swapped"),
              "uphill": (lambda master, grad, lr: (lambda new: (new, bf16_reference(new)))(
                  (master + lr * grad).astype(np.float32)), "goes uphill"),
              "no learning rate": (lambda master, grad, lr: (lambda new: (new, bf16_reference(new)))(
                  (master - grad).astype(np.float32)), "learning rate is missing"),
              "rounded master": (lambda master, grad, lr: (lambda new: (new, new))(
                  bf16_reference((master - lr * grad).astype(np.float32))), "only the copy is rounded"),
          },
          hint_for={'swapped': 1, 'uphill': 3, 'learning rate is missing': 3, 'rounded to bf16': 2,
                    'float32': 2},
          answer="master_update", env={"to_bf16": bf16_reference}, alternate_cell='''
# Exercise 14.master_update · SGD on float32 master weights; the products read a bf16 copy
def master_update(master, grad, lr):
    weights = master.copy()
    weights -= lr * grad                   # in place on a copy: stays float32
    return [weights, to_bf16(weights)]
''', solution_cell='''
# Exercise 14.master_update · SGD on float32 master weights; the products read a bf16 copy
def master_update(master, grad, lr):
    """master, grad: float32 arrays; lr: the learning rate. Return (new master, its bf16 copy)."""
    new = (master - lr * grad).astype(np.float32)   # the step, kept in full in float32
    return new, to_bf16(new)                        # what the next forward's products read
''')
def master_update(answer):
    rng = np.random.default_rng(15)
    master = (1.0 + rng.standard_normal(500) * 0.1).astype(np.float32)
    grad = rng.standard_normal(500).astype(np.float32)
    for on, lr in (("lr = 1e-4: every step under half a bf16 ulp of weights near 1", 1e-4),
                   ("lr = 0.05: steps bf16 can see", 0.05)):
        new, copy = (np.asarray(v) for v in
                     parts(call(answer, master.copy(), grad.copy(), lr, on=on), 2, "(new master, bf16 copy)"))
        copy = np.asarray(copy, np.float32)
        want = (master - np.float32(lr) * grad).astype(np.float32)
        if np.array_equal(new, bf16_reference(bf16_reference(master) - np.float32(lr) * grad)) \
                and not np.array_equal(new, want):
            raise Wrong(f"the master came back rounded to bf16 ({on}): the master must keep its float32 "
                        "bits, or steps under half an ulp vanish.")
        f32 = np.float32(lr) * grad
        for (wrong_new, wrong_copy), why in (
                ((bf16_reference(want), want), "the two are swapped: return the new master first, then "
                 "its bf16 copy"),
                ((master + f32, None), "the step goes uphill, master + lr·grad: gradient descent "
                 "subtracts, master − lr·grad"),
                ((master - grad, None), "the learning rate is missing: the step is lr·grad, not grad"),
                ((bf16_reference(want), None), "the master came back rounded to bf16: the master must keep "
                 "its float32 bits (only the copy is rounded), or steps under half an ulp vanish")):
            if np.allclose(np.asarray(new, np.float64), wrong_new, rtol=0, atol=1e-7) and not np.array_equal(
                    new, want) and (wrong_copy is None or np.allclose(copy, wrong_copy, rtol=0, atol=1e-7)):
                raise Wrong(f"{why} ({on}).")
        if new.dtype != np.float32:  # as it came back (a float64 master is within 1e-7 of it)
            raise Wrong(f"the new master comes back {new.dtype} ({on}): the lesson's master weights "
                        "are float32, beside the bf16 copy the products read; compute the step on "
                        "them as they come, without converting them.")
        compare("the new master", new, want, on=on, source="master − lr·grad in float32 gives",
                tolerance=1e-7)
        compare("the bf16 copy", copy, bf16_reference(want), on=on,
                source="the new master rounded to bf16 gives", tolerance=0.0)
    return "the master keeps every step in float32 and the products read its bf16 rounding"

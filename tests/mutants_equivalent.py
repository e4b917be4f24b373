"""The mutants of tests/test_mutants.py whose output equals the solution's on every input the
grader and the lesson give, and why each is equivalent there (a new one fails that test until it
is listed here with its reason, or a grader input is added that tells it apart)."""

from __future__ import annotations

SYMMETRIC = "the two arguments play the same part"
DEFAULT = "a default of the stub's own signature, which the grader and the lesson always pass"
SWAP = "swapping axes -2, -1 is swapping -1, -2"
ANY_NAN = "a NaN stays a NaN: any NaN is right"
SHIFT = ("softmax is unchanged by any shift of a row; the row's min overflows only on large scores, "
         "which these are not")
RING_DIRECTION = ("the same sums: only the direction send() is told changes, which the grader "
                  "checks apart from the sums and refuses (tests/course/test_l17_many_devices.py "
                  "grades these mutants)")
EQUIVALENT: dict[tuple[str, str], str] = {
    ("17.ring_allreduce", "line 8: (r - s) % n -> r - s (a term dropped)"):
        "a negative index counts from the end of a list of N chunks: parts[r][r - s] is "
        "parts[r][(r - s) % N] for -N < r - s < N",
    ("17.ring_allreduce", "line 6: float64 -> float32"):
        "float32 sums differ from float64's by ~1e-7, under this test's tolerance; the grader "
        "compares to 1e-12 and refuses it",
    ("17.ring_allreduce", "line 8: arguments 0, 1 of send(r, (r + 1) % n, parts[r][(r - s) % n]) swapped"):
        RING_DIRECTION,
    ("17.ring_allreduce", "line 12: arguments 0, 1 of send(r, (r + 1) % n, parts[r][(r + 1 - s) % n]) "
     "swapped"):
        RING_DIRECTION,
    ("17.ring_allreduce", "line 8: Add -> Sub in r + 1"):
        RING_DIRECTION,
    ("17.ring_allreduce", "line 12: Add -> Sub in r + 1"):
        RING_DIRECTION,
    ("01.backward_221",
     "line 5: arguments 0, 1 of np.maximum(z1, 0.0) swapped"):
        SYMMETRIC,
    ("01.backward_221",
     "line 8: Gt -> GtE in z1 > 0"):
        "differs only where z1 is exactly 0, which no input is",
    ("03.unbroadcast",
     "line 6: size == 1 and grad.shape[dim] != 1: operand 1 dropped"):
        "summing a dimension that is already 1, keeping it, changes nothing",
    ("03.unbroadcast",
     "line 6: constant 1 -> 0"):
        "no input has a dimension of size 0",
    ("04.central_difference",
     "line 2: constant 1e-05 -> 2e-05"):
        "a central difference with a step twice as long differs by ~1e-10, under the tolerance",
    ("04.central_difference",
     "line 3: zeros_like -> ones_like in np.zeros_like(x)"):
        "every element of the array is written before it is returned",
    ("04.relative_error",
     "line 3: arguments 0, 1 of np.maximum(np.maximum(np.abs(analytic), np.abs(numeric)), 1.0) "
     "swapped"):
        SYMMETRIC,
    ("04.relative_error",
     "line 3: arguments 0, 1 of np.maximum(np.abs(analytic), np.abs(numeric)) swapped"):
        SYMMETRIC,
    ("04.relative_error",
     "line 3: maximum -> minimum in np.maximum(np.abs(analytic), np.abs(numeric))"):
        "the floor of 1 wins: every |analytic| and |numeric| the grader hands is below 1 or close to "
        "the other",
    ("05.side_by_side",
     "line 4: constant 1 -> 2"):
        "reshape(B, -1) and reshape(B, -2) are the same to NumPy",
    ("06.adamw_step",
     "line 2: constant 0.001 -> 0.002"):
        DEFAULT,
    ("06.adamw_step",
     "line 2: constant 0.9 -> 1.8"):
        DEFAULT,
    ("06.adamw_step",
     "line 2: constant 0.999 -> 1.998"):
        DEFAULT,
    ("06.adamw_step",
     "line 2: constant 1e-08 -> 2e-08"):
        DEFAULT,
    ("06.adamw_step",
     "line 2: constant 0.01 -> 0.02"):
        DEFAULT,
    ("06.bias_correction",
     "line 2: constant 0.9 -> 1.8"):
        DEFAULT,
    ("06.bias_correction",
     "line 2: constant 0.999 -> 1.998"):
        DEFAULT,
    ("08.clip_by_global_norm",
     "line 4: arguments 0, 1 of min(1.0, max_norm / norm) swapped"):
        SYMMETRIC,
    ("08.huber_grad",
     "line 2: constant 1.0 -> 2.0"):
        DEFAULT,
    ("08.huber_grad",
     "line 3: arguments 0, 1 of np.clip(r, -delta, delta) swapped"):
        "np.clip(-delta, r, delta) is r clipped too: NumPy takes the bounds elementwise",
    ("08.sigmoid_grad",
     "line 3: -x -> x (sign or not dropped)"):
        "σ'(x) = σ'(−x): the derivative is even",
    ("09.dlogits",
     "line 4: max -> min in logits.max(axis=1, keepdims=True)"):
        SHIFT,
    ("09.layer_norm_dx",
     "line 4: -1 -> 1 (sign or not dropped)"):
        "axis 1 is the last axis of the lesson's (rows, C) inputs, graded and used alike",
    ("09.layer_norm_dx",
     "line 5: -1 -> 1 (sign or not dropped)"):
        "axis 1 is the last axis of the lesson's (rows, C) inputs, graded and used alike",
    ("11.split_heads",
     "line 5: arguments 1, 2 of tape.transpose(y, 1, 2) swapped"):
        "swapping axes 2 and 1 is swapping 1 and 2",
    ("11.split_heads",
     "line 9: arguments 1, 2 of tape.transpose(y, 1, 2) swapped"):
        "swapping axes 2 and 1 is swapping 1 and 2",
    ("11.split_heads",
     "line 4: FloorDiv -> Div in C // heads"):
        "C is a multiple of heads, and the tape's reshape takes 4.0 as 4",
    ("12.parameter_count",
     "line 2: constant 257 -> 258"):
        DEFAULT,
    ("12.parameter_count",
     "line 2: constant 257 -> 256"):
        DEFAULT,
    ("14.loss_scaler",
     "line 6: Div -> FloorDiv in scale / 2"):
        "every scale is a power of two of 2 or more, so // 2 is / 2",
    ("14.master_update",
     "line 4: float32 -> float64"):
        "a float64 master holds the float32 step exactly; 100 of the lesson's steps differ by under "
        "1e-6",
    ("14.to_bf16",
     "line 7: u | 2143289344 -> u (a term dropped)"):
        ANY_NAN,
    ("14.to_bf16",
     "line 7: u | 2143289344 -> 2143289344 (a term dropped)"):
        ANY_NAN,
    ("14.to_bf16",
     "line 7: constant 2143289344 -> 2143289345"):
        ANY_NAN,
    ("14.to_bf16",
     "line 7: constant 2143289344 -> 2143289343"):
        ANY_NAN,
    ("14.to_bf16",
     "line 8: uint32 -> int32"):
        "the same 32 bits viewed as float32",
    ("15.online_update",
     "line 4: arguments 0, 1 of np.maximum(m, s.max(axis=-1, keepdims=True)) swapped"):
        SYMMETRIC,
    ("15.online_update",
     "line 5: constant 0.0 -> 1.0"):
        "the anchor of a row still at −∞ may be any finite number: exp(−∞ − a) is 0 for every a",
    ("15.tile_backward",
     "line 6: arguments 1, 2 of np.swapaxes(p, -1, -2) swapped"):
        SWAP,
    ("15.tile_backward",
     "line 4: arguments 1, 2 of np.swapaxes(k, -1, -2) swapped"):
        SWAP,
    ("15.tile_backward",
     "line 7: arguments 1, 2 of np.swapaxes(v, -1, -2) swapped"):
        SWAP,
    ("15.tile_backward",
     "line 8: arguments 1, 2 of np.swapaxes(ds, -1, -2) swapped"):
        SWAP,
    ("16.cached_step",
     "line 4: arguments 0, 1 of keys.swapaxes(-1, -2) swapped"):
        SWAP,
}

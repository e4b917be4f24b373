"""The precision policy: which number format a matrix product reads its inputs in.

A run picks one of fp32, tf32, bf16, fp16 (`Tape(precision=...)`, `train --precision`). Only the
matrix products change: their inputs are rounded to the format, they accumulate in float32, and
everything else (weights, optimizer state, softmax, LayerNorm, the loss, reductions) stays
float32. On the CPU the rounding is emulated exactly (`round_to`); the GPU rounds the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes  # bfloat16 for NumPy: the bits the GPU's bf16 has, rounded to nearest even
import numpy as np

from ..errors import SmallemError


@dataclass(frozen=True)
class Format:
    """A floating-point format: 1 sign bit, `exponent` bits, `mantissa` stored bits."""

    name: str
    exponent: int
    mantissa: int
    peak_tflops: float  # the H200's dense matrix rate in this format (datasheet; fp32: no tensor cores)

    @property
    def bits(self) -> int:
        return 1 + self.exponent + self.mantissa

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent - 1) - 1

    @property
    def eps(self) -> float:
        """The gap from 1 to the next number: 2^-mantissa."""
        return 2.0 ** -self.mantissa

    @property
    def max(self) -> float:
        return (2.0 - self.eps) * 2.0 ** self.bias

    @property
    def tiny(self) -> float:
        """The smallest normal number; below it precision falls away (subnormals)."""
        return 2.0 ** (1 - self.bias)

    @property
    def smallest(self) -> float:
        """The smallest subnormal: anything under half of it rounds to zero."""
        return 2.0 ** (1 - self.bias - self.mantissa)


FORMATS = {
    "fp32": Format("fp32", 8, 23, 67.0),
    "tf32": Format("tf32", 8, 10, 495.0),
    "bf16": Format("bf16", 8, 7, 989.0),
    "fp16": Format("fp16", 5, 10, 989.0),
}
PRECISIONS = tuple(FORMATS)


def get_format(name: str) -> Format:
    if name not in FORMATS:
        raise SmallemError(f"unknown precision {name!r}: choose one of {', '.join(PRECISIONS)}")
    return FORMATS[name]


def round_tf32(x: np.ndarray) -> np.ndarray:
    """float32 with its mantissa rounded to TF32's 10 bits, to nearest, ties to even (by the bits)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)  # (not ascontiguousarray: 0-d stays 0-d)
    keep = (bits >> 13) & 1  # the last bit kept: a tie rounds towards making it 0
    finite = (bits & 0x7F800000) != 0x7F800000  # inf and NaN pass unchanged
    rounded = np.where(finite, (bits + 0x0FFF + keep) & 0xFFFFE000, bits).astype(np.uint32)
    return rounded.view(np.float32)


def round_fp16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to fp16's values (ties to even), kept float32: NumPy's own conversion
    takes a slow path for fp16's subnormals, 20 times slower, and gradients live there."""
    x = np.asarray(x, dtype=np.float32)
    sub = np.abs(x) < np.float32(2.0 ** -14)  # below fp16's smallest normal: steps of 2^-24
    r = np.where(sub, np.rint(x * np.float32(2.0 ** 24)) * np.float32(2.0 ** -24), round_tf32(x))
    big = np.abs(r) > np.float32(65504.0)  # past fp16's max (65520 and up round there): inf
    return np.where(big, np.copysign(np.float32(np.inf), x), r).astype(np.float32)


def round_to(x: Any, precision: str) -> np.ndarray:
    """x as float32 holding only values of `precision` (what a tensor core would read)."""
    if precision == "fp32":
        return np.asarray(x, dtype=np.float32)
    if precision == "tf32":
        return round_tf32(np.asarray(x, dtype=np.float32))
    if precision == "fp16":
        return round_fp16(x)
    if precision != "bf16":
        get_format(precision)  # raises the sentence
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def rounder(precision: str, dtype: Any) -> Any:
    """The function a CPU backend's matmul applies to each input (None for fp32)."""
    if precision == "fp32":
        return None
    get_format(precision)
    return lambda a: round_to(a, precision).astype(dtype, copy=False)


def tolerance(precision: str, scale: float = 8.0) -> float:
    """How far a gradient of this precision may stray from float64's, relative: `scale` times
    the format's eps (each product input rounds by at most eps/2, the errors add up in a few)."""
    return scale * get_format(precision).eps


@dataclass
class LossScaler:
    """fp16's dynamic loss scale. The loss is multiplied by `scale` before backward, so small
    gradients stay above fp16's smallest number; the gradients are divided by it before the
    update. A step whose gradients overflowed (inf or NaN) is skipped and the scale halved;
    after `interval` clean steps in a row it is doubled. Its state (`state()`) travels in a
    run's checkpoint, so a resumed run continues with the scale it had reached."""

    scale: float = 2.0 ** 16
    interval: int = 200  # clean steps before growing (PyTorch's GradScaler waits 2000)
    clean: int = 0
    skipped: int = 0
    # A captured GPU step keeps the state on the device; it sets this to bring it back first.
    settle: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        scale = self.scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating)):
            raise SmallemError(f"the loss scale must be a number (2**16 is usual), got {scale!r}")
        if not math.isfinite(scale):
            raise SmallemError(f"the loss scale must be finite, got {scale!r}: every step would "
                               "overflow and be skipped; start from 2**16")
        if scale <= 0:
            raise SmallemError(f"the loss scale must be above 0, got {scale!r}: the gradients would "
                               "be zeroed (or flipped) and then divided by it; start from 2**16")
        for name in ("interval", "clean", "skipped"):
            value, least = getattr(self, name), 1 if name == "interval" else 0
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
                raise SmallemError(
                    f"the loss scaler's {name} must be a whole number of steps, {least} or more, "
                    f"got {value!r}" + (": with 0 the scale would never grow" if value == 0 else ""))
        self.scale, self.interval = float(scale), int(self.interval)
        self.clean, self.skipped = int(self.clean), int(self.skipped)

    def update(self, finite: bool) -> bool:
        """Record one step's verdict; True when its update should be applied."""
        if not finite:
            self.scale, self.clean, self.skipped = self.scale / 2.0, 0, self.skipped + 1
            return False
        self.clean += 1
        if self.clean == self.interval:
            self.scale, self.clean = self.scale * 2.0, 0
        return True

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (JSON-able): the scale reached and the counts."""
        if self.settle is not None:
            self.settle()
        return {"scale": self.scale, "interval": self.interval, "clean": self.clean,
                "skipped": self.skipped}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from `state()`'s dictionary (checked as the constructor checks)."""
        if not isinstance(state, dict) or set(state) != {"scale", "interval", "clean", "skipped"}:
            raise SmallemError(f"the checkpoint's loss scaler state is not scale, interval, clean "
                               f"and skipped: {state!r}; the file was edited or damaged")
        checked = LossScaler(**state)
        self.scale, self.interval = checked.scale, checked.interval
        self.clean, self.skipped = checked.clean, checked.skipped


def all_finite(backend: Any, grads: list) -> bool:
    """True when no gradient holds an inf or a NaN (one read of the device): the backend's own
    check where it has one (the GPU's finite-check kernels), else isfinite, all and stack."""
    own = getattr(backend, "all_finite", None)
    verdict = own(grads) if own is not None else None
    if verdict is not None:
        return verdict
    xp = getattr(backend, "xp", np)
    flags = [xp.isfinite(g).all() for g in grads if g is not None]
    return bool(xp.stack(flags).all()) if flags else True


def describe(precision: str) -> str:
    """One line a bench row or a log prints: what the matrix products read and what they add in."""
    f = get_format(precision)
    inputs = "float32" if precision == "fp32" else f"{precision} ({f.mantissa}-bit mantissa)"
    return f"matrix inputs {inputs}, float32 accumulation; weights and optimizer float32"


def ulp(x: float, precision: str) -> float:
    """The gap between x and the next number of the format (for a normal x)."""
    f = get_format(precision)
    exponent = math.floor(math.log2(abs(x))) if x else 1 - f.bias
    return 2.0 ** (max(exponent, 1 - f.bias) - f.mantissa)

"""The 2-2-1 ReLU network that lesson 01 differentiates by hand and lesson 07 kills.

Two inputs, two ReLU hidden units, one linear output, zero biases, L = ½(ŷ − y)². Every
forward and backward pass runs on the tape; a `StepRecord` keeps every number of one step
(weights, activations, loss, gradients, dead units) so plots and widgets can show them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..autodiff.tape import Tape, Var
from ..backends import DEFAULT_BACKEND, Backend

# The seed's network. Column-vector convention: z1 = W1 @ x, ŷ = W2 @ a1.
X = np.array([1.0, 2.0])
Y = 1.0
W1 = np.array([[0.1, 0.3],
               [0.2, 0.4]])  # (hidden, input): row j feeds hidden unit j
W2 = np.array([0.5, -0.5])  # (hidden,): one output
# The biases are zero and the seed does not train them, so they are left out: training them
# would change the trajectory that lesson 07 reproduces.

CLIFF_STEPS = 20  # steps behind "final loss" in the scan and the widget


@dataclass(frozen=True)
class StepRecord:
    """Every number of the network at one point of training.

    `step` counts the updates already made: record 0 holds the initial weights, record k the
    weights after k updates, with the forward and backward pass computed at those weights."""

    step: int
    lr: float
    x: np.ndarray  # (2,)
    y: float
    W1: np.ndarray  # (2, 2)
    W2: np.ndarray  # (2,)
    z1: np.ndarray  # (2,) pre-activations of the hidden units
    a1: np.ndarray  # (2,) ReLU(z1)
    y_hat: float
    loss: float
    dy_hat: float  # ∂L/∂ŷ = ŷ − y
    dW2: np.ndarray  # (2,)
    da1: np.ndarray  # (2,) ∂L/∂a1 = ∂L/∂ŷ · W2
    dz1: np.ndarray  # (2,) ∂L/∂z1: zero where the unit is dead
    dW1: np.ndarray  # (2, 2)
    slope: float = 0.0  # the hidden units' slope below zero: 0 for ReLU, > 0 for leaky ReLU

    @property
    def below_zero(self) -> tuple[bool, bool]:
        """Units whose pre-activation is ≤ 0: on ReLU's flat side (leaky ReLU's shallow one)."""
        return tuple(bool(z <= 0) for z in self.z1)  # type: ignore[return-value]

    @property
    def dead(self) -> tuple[bool, bool]:
        """A ReLU unit whose pre-activation is ≤ 0 passes no gradient back: it cannot learn.
        A leaky unit is never dead: below zero it still passes `slope` times the gradient."""
        return tuple(b and self.slope == 0 for b in self.below_zero)  # type: ignore[return-value]

    @property
    def dead_count(self) -> int:
        return sum(self.dead)


def record(W1: np.ndarray = W1, W2: np.ndarray = W2, x: np.ndarray = X, y: float = Y, *,
           slope: float = 0.0, backend: Backend | str = DEFAULT_BACKEND) -> tuple[Tape, dict[str, Var]]:
    """The forward pass recorded on a fresh tape, not yet differentiated: the tape and its
    named Vars ("W1", "W2", "x", "z1", "a1", "y_hat", "L"), for a step-through of backward.
    `slope` > 0 makes the hidden units leaky: a = z for z > 0, slope·z below."""
    tape = Tape(backend)
    v = {"W1": tape.leaf(np.asarray(W1, dtype=np.float64)),  # (2, 2)
         "W2": tape.leaf(np.asarray(W2, dtype=np.float64).reshape(1, 2)),  # (1, 2): a row
         "x": tape.constant(np.asarray(x, dtype=np.float64).reshape(2, 1))}  # (2, 1): a column
    v["z1"] = v["W1"] @ v["x"]  # (2, 1)
    v["a1"] = tape.relu(v["z1"])  # (2, 1)
    if slope:  # leaky ReLU from primitives: relu(z) − slope·relu(−z)
        v["a1"] = v["a1"] - tape.relu(-v["z1"]) * float(slope)
    v["y_hat"] = v["W2"] @ v["a1"]  # (1, 1)
    v["L"] = tape.sum(tape.square(v["y_hat"] - float(y))) * 0.5  # () : ½(ŷ − y)²
    return tape, v


def forward_backward(W1: np.ndarray = W1, W2: np.ndarray = W2, x: np.ndarray = X, y: float = Y,
                     *, step: int = 0, lr: float = 0.0, slope: float = 0.0,
                     backend: Backend | str = DEFAULT_BACKEND) -> StepRecord:
    """One forward and one backward pass on a fresh tape; every number in a StepRecord."""
    tape, v = record(W1, W2, x, y, slope=slope, backend=backend)
    w1, w2, z1, a1, y_hat, loss = (v[k] for k in ("W1", "W2", "z1", "a1", "y_hat", "L"))
    grads = tape.backward(loss)

    def host(t) -> np.ndarray:
        return np.asarray(tape.backend.to_numpy(t), dtype=np.float64)

    return StepRecord(
        step=step, lr=float(lr), x=np.asarray(x, np.float64).copy(), y=float(y),
        W1=host(w1.value), W2=host(w2.value).reshape(2),
        z1=host(z1.value).reshape(2), a1=host(a1.value).reshape(2),
        y_hat=float(host(y_hat.value).reshape(())), loss=float(host(loss.value).reshape(())),
        dy_hat=float(host(grads[y_hat]).reshape(())),
        dW2=host(grads[w2]).reshape(2), da1=host(grads[a1]).reshape(2),
        dz1=host(grads[z1]).reshape(2), dW1=host(grads[w1]), slope=float(slope),
    )


def gradient_step(record: StepRecord, lr: float) -> tuple[np.ndarray, np.ndarray]:
    """w ← w − η ∂L/∂w for both weight matrices; returns the new (W1, W2)."""
    return record.W1 - lr * record.dW1, record.W2 - lr * record.dW2


def gradient_descent(lr: float, steps: int = CLIFF_STEPS, W1: np.ndarray = W1, W2: np.ndarray = W2,
                     x: np.ndarray = X, y: float = Y, *, slope: float = 0.0,
                     backend: Backend | str = DEFAULT_BACKEND) -> list[StepRecord]:
    """Gradient descent at learning rate `lr`: `steps + 1` records, from step 0 (the initial
    weights) to step `steps` (the weights after the last update). `slope` > 0: leaky ReLU."""
    records = [forward_backward(W1, W2, x, y, step=0, lr=lr, slope=slope, backend=backend)]
    for k in range(1, steps + 1):
        w1, w2 = gradient_step(records[-1], lr)
        records.append(forward_backward(w1, w2, x, y, step=k, lr=lr, slope=slope,
                                        backend=backend))
    return records


def first_death(records: Sequence[StepRecord]) -> list[int | None]:
    """For each hidden unit, the first step at which it is dead (None if it never dies)."""
    return [next((r.step for r in records if r.dead[j]), None) for j in range(2)]


@dataclass(frozen=True)
class LrScan:
    """Final loss and dead units after `steps` updates, for each learning rate."""

    lrs: np.ndarray
    final_loss: np.ndarray
    dead_count: np.ndarray  # dead hidden units at the end, 0, 1 or 2
    steps: int = CLIFF_STEPS

    @property
    def cliff(self) -> float | None:
        """The smallest scanned learning rate from which every larger one ends with both
        hidden units dead: the edge of the cliff (None if the scan never goes over it)."""
        all_dead = self.dead_count == 2
        if not all_dead[-1]:
            return None
        alive = np.flatnonzero(~all_dead)
        first = 0 if alive.size == 0 else alive[-1] + 1
        return float(self.lrs[first])


def scan_learning_rates(lrs: Sequence[float] | None = None, steps: int = CLIFF_STEPS, *,
                        backend: Backend | str = DEFAULT_BACKEND) -> LrScan:
    """Train the seed's network at each learning rate (101 log-spaced from 0.01 to 1 by
    default) and keep the final loss and the dead units."""
    lrs = np.logspace(-2, 0, 101) if lrs is None else np.asarray(lrs, dtype=np.float64)
    runs = [gradient_descent(float(lr), steps, backend=backend) for lr in lrs]
    return LrScan(lrs=lrs,
                  final_loss=np.array([r[-1].loss for r in runs]),
                  dead_count=np.array([r[-1].dead_count for r in runs]),
                  steps=steps)


def find_cliff(low: float = 0.1, high: float = 1.0, steps: int = CLIFF_STEPS, *,
               tol: float = 1e-4, backend: Backend | str = DEFAULT_BACKEND) -> float:
    """Bisect for the learning rate where training starts to end with both hidden units
    dead: `low` must survive and `high` must not. Returns the edge within `tol`."""
    def dies(lr: float) -> bool:
        return gradient_descent(lr, steps, backend=backend)[-1].dead_count == 2

    if dies(low) or not dies(high):
        raise ValueError(f"find_cliff needs a surviving low ({low}) and a dying high ({high})")
    while high - low > tol:
        mid = 0.5 * (low + high)
        low, high = (low, mid) if dies(mid) else (mid, high)
    return high

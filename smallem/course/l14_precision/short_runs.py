"""Short training runs of one small Transformer in a chosen precision, read step by step: what
notebook 14 trains on the CPU and record.py records on a GPU (fp16 with and without a loss
scaler, bf16, fp32), with the loss scaled as in a large run's batch.
"""

from __future__ import annotations

import numpy as np

from ...backends import get_backend
from ...backends.precision import LossScaler
from ...data import SequenceSampler
from ...models.transformer import Transformer, TransformerConfig
from ...optim import AdamW
from ...training.bar import progress_bar
from ...training.step import train_step

LESSON_MODEL = TransformerConfig(layers=1, width=32, heads=2, context=32)  # seconds on a CPU
LESSON_BATCH = 16  # sequences: 512 predictions a step
# The lesson's loss is scaled as if averaged over 2^20 predictions (512 · 2048), the size of a
# large run's batch (nanoGPT's GPT-2 averages over about 0.5M tokens a step): each prediction's
# gradient is then as small as it is there, which is where fp16 runs out of numbers.
LESSON_FACTOR = 1 / 2048


def short_run(precision: str, *, steps: int, scaler: LossScaler | None = None, loss_factor: float = 1.0,
              tokens: np.ndarray, seed: int = 0, batch: int = LESSON_BATCH, lr: float = 3e-3,
              backend: str = "cpu", progress: str = "") -> list[float]:
    """Train LESSON_MODEL for `steps` in `precision` and return each step's loss (read each
    step: on a GPU that waits for it, which a lesson's run can afford).
    `loss_factor` multiplies the loss before backward, as a run that accumulates gradients over
    1/loss_factor micro-batches does (nanoGPT: loss / gradient_accumulation_steps); AdamW divides
    by the gradients' own size, so in float32 the updates change only through its ε, which the
    scaled gradients no longer dwarf. `progress` names a progress bar to show (none when empty)."""
    be = get_backend(backend, precision)
    model = Transformer(LESSON_MODEL, be, seed=seed)
    optimizer = AdamW(lr=lr)
    sampler = SequenceSampler(tokens, batch, LESSON_MODEL.context, seed=seed)
    losses = []
    for _ in progress_bar(range(steps), disable=not progress, desc=progress, unit="step", leave=True):
        x, y = sampler.next()
        loss = train_step(be, model, optimizer,
                          lambda tape: tape.mul(model.loss(tape, x, y), loss_factor), scaler=scaler)
        losses.append(be.item(loss) / loss_factor)
    return losses

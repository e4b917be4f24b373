"""The three checks to run before any long training (article 7): they catch most bugs in
seconds. Initial loss near ln V, one batch learned by heart, the same losses on CPU and GPU.
Each returns a CheckResult; `smallem checks` prints them and notebook 05 asserts them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any

from ..autodiff.tape import Tape
from ..backends import Backend, get_backend, gpu_available
from ..data import BatchSampler, Corpus, SequenceSampler, distinct_batch, load_corpus
from ..errors import SmallemError
from ..models.mlp import MlpConfig
from ..models.protocol import LanguageModel, ModelConfig
from ..optim import ADAMW_LR, AdamW
from . import registry
from .registry import BATCH, SEQUENCES
from .step import train_step


def _model(config: ModelConfig, backend: Backend | str, seed: int) -> LanguageModel:
    return registry.for_config(config).build(config, backend, seed)


def _reads_sequences(config: ModelConfig) -> bool:
    return registry.for_config(config).reads == SEQUENCES


def _sampler(config: ModelConfig, tokens: Any, batch: int, seed: Any) -> BatchSampler:
    """Windows and their next byte (the MLP); or sequences, every byte's next (the
    Transformer): as the model reads, registry.py says."""
    kind = SequenceSampler if _reads_sequences(config) else BatchSampler
    return kind(tokens, batch, config.context, seed=seed)


@dataclass
class CheckResult:
    name: str
    status: str  # "pass", "fail" or "skip"
    value: float | None  # the measured number (a loss, a difference)
    expected: str  # what passing means, in words
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def __str__(self) -> str:
        value = "" if self.value is None else f"{self.value:.6g}"
        return f"{self.status.upper():<5} {self.name:<22} {value:<12} {self.expected}" + \
            (f"  ({self.detail})" if self.detail else "")


def check_initial_loss(backend: Backend | str = "cpu", *, corpus: Corpus | None = None,
                       config: ModelConfig | None = None, seed: int = 0, batch: int = BATCH,
                       tolerance: float | None = None) -> CheckResult:
    """With weights N(0, 0.02) the logits start near 0, every byte is equally likely, and the
    loss must be ln V (ln 257 ≈ 5.549). Far from it, the initialisation is wrong.

    The MLP's logits start within about 1e-3 of 0: 0.01 is its tolerance. A Transformer's final
    LayerNorm hands the head vectors of unit size, so its logits start spread by 0.02·√C (0.23
    at C = 128), and bytes are not equally frequent: the first loss sits a few hundredths from
    ln V, by the initial weights (measured 5.508 to 5.571 over seeds and corpora), hence 0.05."""
    config = config or MlpConfig()
    if tolerance is None:
        tolerance = 0.05 if _reads_sequences(config) else 0.01
    corpus = corpus or load_corpus()
    model = _model(config, backend, seed)
    contexts, targets = _sampler(config, corpus.train, batch, seed).next()
    tape = Tape(model.parameters()[0].backend)
    loss = float(tape.backend.item(tape.value(model.loss(tape, contexts, targets))))
    tape.close()
    expected = math.log(config.vocab)
    gap = abs(loss - expected)
    return CheckResult("initial loss", "pass" if gap <= tolerance else "fail", loss,
                       f"ln {config.vocab} = {expected:.4f} ± {tolerance}", f"off by {gap:.2g}")


def check_overfit(backend: Backend | str = "cpu", *, corpus: Corpus | None = None,
                  config: ModelConfig | None = None, seed: int = 0, batch: int = 64,
                  max_steps: int = 300, lr: float = ADAMW_LR, target: float = 0.05
                  ) -> CheckResult:
    """Train on one fixed batch until the loss is below `target`: a model that cannot learn
    64 examples by heart has a bug in its forward, its backward or its optimizer. The batch's
    contexts are all different, or no model could reach zero. A Transformer is scored at the
    last position of each window, as the MLP (earlier positions share short prefixes such as
    runs of spaces, followed by different bytes: no model can learn those by heart)."""
    config = config or MlpConfig()
    corpus = corpus or load_corpus()
    backend = get_backend(backend)
    model = _model(config, backend, seed)
    optimizer = AdamW(lr=lr, weight_decay=0.0)
    contexts, targets = distinct_batch(corpus.train, batch, config.context, seed=seed)
    loss = math.inf
    for step in range(1, max_steps + 1):
        loss_tensor = train_step(backend, model, optimizer,
                                 lambda tape: model.loss(tape, contexts, targets))
        if step % 5 == 0 or step == max_steps:  # reading the loss syncs a GPU: not every step
            loss = backend.item(loss_tensor)
            if loss < target:
                break
    return CheckResult("overfit one batch", "pass" if loss < target else "fail", loss,
                       f"below {target} within {max_steps} steps",
                       f"{step} steps, batch of {batch} distinct contexts")


def loss_curve(backend: Backend | str, corpus: Corpus, steps: int, *, every: int = 50,
               config: ModelConfig | None = None, seed: int = 0, batch: int = BATCH,
               lr: float = ADAMW_LR) -> dict[int, float]:
    """Train losses read every `every` steps, from seeded weights and seeded batches: the
    same numbers on every backend up to rounding."""
    backend = get_backend(backend)
    config = config or MlpConfig()
    model = _model(config, backend, seed)
    optimizer = AdamW(lr=lr)
    sampler = _sampler(config, corpus.train, batch, [seed, 1])
    losses = {}
    for step in range(1, steps + 1):
        contexts, targets = sampler.next()
        loss = train_step(backend, model, optimizer,
                          lambda tape: model.loss(tape, contexts, targets))
        if step % every == 0 or step == steps:
            losses[step] = backend.item(loss)
    return losses


def check_backends_agree(reference: str = "cpu", other: str = "gpu", *,
                         corpus: Corpus | None = None, steps: int = 500, every: int = 50,
                         tolerance: float = 5e-5, **kwargs) -> CheckResult:
    """Same seed, same weights, same batches on two backends: the losses at `steps` must
    agree to `tolerance`, four decimals by default, as the seed's GPU and CPU did at step 500."""
    name = f"{reference} vs {other} loss"
    for b in (reference, other):
        if b == "gpu" and not gpu_available():
            why = ("CuPy is not installed: install smallem[gpu-cuda12] or [gpu-cuda13] (as "
                   "`nvidia-smi` says) on a machine with an NVIDIA GPU" if find_spec("cupy") is None
                   else "no CUDA device visible to CuPy: run `smallem checks` on a machine with "
                   "an NVIDIA GPU")
            return CheckResult(name, "skip", None, f"agree to {tolerance} at step {steps}",
                               f"{why} to compare")
    corpus = corpus or load_corpus()
    a = loss_curve(reference, corpus, steps, every=every, **kwargs)
    b = loss_curve(other, corpus, steps, every=every, **kwargs)
    gap = abs(a[steps] - b[steps])
    worst = max(abs(a[s] - b[s]) for s in a)
    return CheckResult(name, "pass" if gap <= tolerance else "fail", gap,
                       f"|difference| at step {steps} ≤ {tolerance}",
                       f"{reference} {a[steps]:.6f}, {other} {b[steps]:.6f}, largest gap on "
                       f"the way {worst:.2g}")


def checked_models() -> tuple[str, ...]:
    """The registered models the three checks apply to (not the bigram: it cannot learn a
    batch of distinct windows by heart, reading one byte of each)."""
    return tuple(e.name for e in registry.entries() if e.checked)


def run_checks(backend: Backend | str = "cpu", corpus: Corpus | None = None,
               model: str = "mlp", sizes: ModelConfig | None = None,
               announce: Callable[[str], Any] | None = None) -> list[CheckResult]:
    """The three checks of `model` (a registered one, default sizes or `sizes`) on `backend`;
    the third compares cpu with gpu whatever `backend` is. A corpus of BPE ids and sizes with
    their vocabulary check a token model: its initial loss is ln V of that V. `announce` hears
    each check's name as it starts (on a CPU a Transformer's take minutes: the command line says
    what runs)."""
    entry = registry.get(model)
    if not entry.checked:
        raise SmallemError(f"the checks do not apply to the {model}: choose one of "
                           f"{', '.join(checked_models())}")
    backend = get_backend(backend)  # an unknown one refused before any check is announced
    corpus = corpus or load_corpus()
    config = sizes or entry.config()
    batch = entry.batch  # as it trains: a Transformer example is 64 bytes
    checks = {
        "initial loss": lambda: check_initial_loss(backend, corpus=corpus, config=config,
                                                   batch=batch),
        "overfit one batch": lambda: check_overfit(backend, corpus=corpus, config=config),
        "cpu vs gpu loss": lambda: check_backends_agree("cpu", "gpu", corpus=corpus,
                                                        config=config, batch=batch),
    }
    results = []
    for name, check in checks.items():
        if announce is not None:
            announce(name)
        results.append(check())
    return results


def format_checks(results: list[CheckResult]) -> str:
    return "\n".join(str(r) for r in results)


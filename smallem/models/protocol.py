"""What a language model provides, for everything that trains, scores or samples one: its config
(`context`, the bytes it reads at once, and `vocab`), `logits` and `loss` on a tape, and its
parameters by name. The models of this folder meet it; training/registry.py lists them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ..autodiff.tape import Tape, Var
from ..nn import Parameter


class ModelConfig(Protocol):
    """A model's sizes, a dataclass: at least the window it reads and the tokens it scores."""

    context: int  # bytes read at once (T)
    vocab: int  # tokens it scores (V)


@runtime_checkable
class LanguageModel(Protocol):
    """inputs (B, T) integers -> logits (B, V) from a window, or (B, T, V) from a sequence."""

    config: ModelConfig

    def logits(self, tape: Tape, inputs: Any) -> Var: ...
    def loss(self, tape: Tape, inputs: Any, targets: Any) -> Var: ...
    def parameters(self) -> list[Parameter]: ...
    def named_parameters(self) -> Sequence[tuple[str, Parameter]]: ...
    def parameter_count(self) -> int: ...

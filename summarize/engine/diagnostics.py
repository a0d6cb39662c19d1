"""What the engine reports about its state, span by span (design §4).

The engine never renders anything: it hands a `SpanReport` to a listener (a plain callable) after
each span it processes — a prefill call or a decode step. A `RichUI` draws it, tests record it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from summarize.errors import SummarizeError

Phase = Literal["prefill", "decode"]


@dataclass(frozen=True)
class LayerReport:
    """One layer after one span, for one sequence of the batch.

    Recurrent layers fill state_norm (‖S‖_F after the span, all heads), gate_mean (mean decay
    α_t over the span's tokens and heads) and delta_norm (mean over tokens of ‖k_t u_tᵀ‖_F).
    Attention layers fill kv_tokens and kv_bytes instead. Fields that do not apply are None.
    """

    layer: int
    kind: Literal["recurrent", "attention"]
    state_norm: float | None = None
    gate_mean: float | None = None
    delta_norm: float | None = None
    kv_tokens: int | None = None
    kv_bytes: int | None = None


@dataclass(frozen=True)
class SpanReport:
    """All layers after one span of `tokens` tokens, for sequence `sequence` of the batch."""

    phase: Phase
    sequence: int
    tokens: int
    layers: tuple[LayerReport, ...]
    state_bytes: int


Listener = Callable[[SpanReport], None]


class NonFiniteStateError(SummarizeError):
    """A NaN or Inf appeared in a layer's state."""

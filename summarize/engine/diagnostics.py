"""What the engine reports about its state, span by span (design §4).

The engine never renders anything: it hands a `SpanReport` to a listener (a plain callable) after
each span it processes — a prefill call or a decode step. A `RichUI` draws it, tests record it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch

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


def merge_block_stats(blocks: list[list]) -> list:
    """Join per-layer (tokens, DeltaRuleStats) of a span run in several blocks.

    Means are token-weighted; the state norm is the one after the last block. Entries that are
    None (attention layers) stay None.
    """
    from summarize.engine.ops.gated_delta_rule import DeltaRuleStats

    if len(blocks) == 1:
        return blocks[0]
    merged = []
    for per_block in zip(*blocks):
        if per_block[0] is None or per_block[0][1] is None:
            merged.append(per_block[0])
            continue
        total = sum(t for t, _ in per_block)
        merged.append((total, DeltaRuleStats(
            state_norm=per_block[-1][1].state_norm,
            gate_mean=sum(s.gate_mean * t for t, s in per_block) / total,
            delta_norm=sum(s.delta_norm * t for t, s in per_block) / total,
        )))
    return merged


def report_span(stats: list, state, phase: Phase, tokens: int, listener: Listener | None) -> None:
    """Check the recurrent states for NaN/Inf, then hand one `SpanReport` per sequence to `listener`.

    stats: per layer, (tokens, DeltaRuleStats) for a recurrent layer, None for an attention layer
    (its KV cache in `state` is reported instead). Layers without stats (decode with nobody
    listening) are skipped.
    """
    from summarize.engine.state import KVCache

    recurrent = [(i, s) for i, s in enumerate(stats) if s is not None and s[1] is not None]
    if not recurrent:
        return
    # one host sync for the whole span: [layers, 3, B]
    table = torch.stack([torch.stack([s.state_norm, s.gate_mean, s.delta_norm]) for _, (_, s) in recurrent]).tolist()
    for (i, _), row in zip(recurrent, table):
        if not all(math.isfinite(value) for value in row[0]):
            raise NonFiniteStateError(f"layer {i}: the recurrent state holds NaN or Inf")
    if listener is None:
        return
    by_layer = dict(zip((i for i, _ in recurrent), table))
    batch = state.batch_size
    for b in range(batch):
        layers = []
        for i, layer_state in enumerate(state.layers):
            if isinstance(layer_state, KVCache):
                layers.append(LayerReport(i, "attention", kv_tokens=layer_state.length, kv_bytes=layer_state.nbytes // batch))
            else:
                norm, gate, delta = (by_layer[i][j][b] for j in range(3))
                layers.append(LayerReport(i, "recurrent", state_norm=norm, gate_mean=gate, delta_norm=delta))
        listener(SpanReport(phase, b, tokens, tuple(layers), state.nbytes // batch))

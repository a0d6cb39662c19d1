"""What the engine reports about its state, span by span (docs/design.md §4).

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
    """All layers after one span of `tokens` tokens, for sequence `sequence` of the batch.

    A verified draft (speculative decoding) reports the tokens the sequence kept: its last token
    and `tokens - 1` of the `drafted` tokens it was offered.
    """

    phase: Phase
    sequence: int
    tokens: int
    layers: tuple[LayerReport, ...]
    state_bytes: int
    drafted: int = 0


Listener = Callable[[SpanReport], None]


class NonFiniteStateError(SummarizeError):
    """A NaN or Inf appeared in a layer's state."""


@dataclass
class RecurrenceStats:
    """What one recurrent layer's op measured over a span, fp32, one value per batch row.

    state_norm: [B]  Frobenius norm of the state after the span, all heads together.
    gate_mean:  [B]  mean decay over the span's tokens and heads (and channels, where the decay
                     is per channel), in (0, 1].
    delta_norm: [B]  mean over the span's tokens of the Frobenius norm of what a token writes into
                     the state, heads summed in quadrature.
    """

    state_norm: torch.Tensor
    gate_mean: torch.Tensor
    delta_norm: torch.Tensor


LayerStats = list[RecurrenceStats | None]  # per layer; None: an attention layer, or no stats asked for


def merge_block_stats(blocks: list[tuple[int, LayerStats]]) -> LayerStats:
    """Join the per-layer stats of a span run in several blocks of (tokens, stats).

    Means are token-weighted; the state norm is the one after the last block.
    """
    if len(blocks) == 1:
        return blocks[0][1]
    total = sum(tokens for tokens, _ in blocks)
    merged: LayerStats = []
    for per_block in zip(*(stats for _, stats in blocks)):
        if per_block[0] is None:
            merged.append(None)
            continue
        weighted = list(zip((tokens for tokens, _ in blocks), per_block))
        merged.append(RecurrenceStats(
            state_norm=per_block[-1].state_norm,
            gate_mean=sum(s.gate_mean * t for t, s in weighted) / total,
            delta_norm=sum(s.delta_norm * t for t, s in weighted) / total,
        ))
    return merged


def report_span(
    stats: LayerStats | None, state, phase: Phase, tokens: int | list[int], listener: Listener | None,
    drafted: list[int] | None = None,
) -> None:
    """Check the recurrent states for NaN/Inf, then hand one `SpanReport` per sequence to `listener`.

    `tokens`: the span's length, or one per sequence where rows kept different numbers (a verified
    draft, with `drafted` the drafts each sequence was offered).

    Layers with stats are the recurrent ones; the others (attention) report their cache, as the
    state counts it. No stats at all (decode with nobody listening): nothing to check or say.
    """
    recurrent = [(i, s) for i, s in enumerate(stats or ()) if s is not None]
    if not recurrent:
        return
    # one host sync for the whole span: [layers, 3, B]
    table = torch.stack([torch.stack([s.state_norm, s.gate_mean, s.delta_norm]) for _, s in recurrent]).tolist()
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
            if i in by_layer:
                norm, gate, delta = (by_layer[i][j][b] for j in range(3))
                layers.append(LayerReport(i, "recurrent", state_norm=norm, gate_mean=gate, delta_norm=delta))
            else:
                kv_bytes = layer_state.nbytes // batch
                layers.append(LayerReport(i, "attention", kv_tokens=layer_state.cached_tokens, kv_bytes=kv_bytes))
        row_tokens = tokens if isinstance(tokens, int) else tokens[b]
        listener(SpanReport(phase, b, row_tokens, tuple(layers), state.nbytes // batch, drafted[b] if drafted else 0))

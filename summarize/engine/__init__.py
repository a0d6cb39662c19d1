"""The engine: recurrent-state language models in pure PyTorch (docs/design.md §2-§5)."""

from summarize.engine.diagnostics import LayerReport, NonFiniteStateError, RecurrenceStats, SpanReport
from summarize.engine.loading import ModelNotAvailable, load_model, load_tokenizer
from summarize.engine.state import KVCache, RecurrentLayerState, Snapshot, State

__all__ = [
    "KVCache",
    "LayerReport",
    "ModelNotAvailable",
    "NonFiniteStateError",
    "RecurrenceStats",
    "RecurrentLayerState",
    "Snapshot",
    "SpanReport",
    "State",
    "load_model",
    "load_tokenizer",
]

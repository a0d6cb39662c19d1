"""The engine: recurrent-state language models in pure PyTorch (docs/design.md §2-§5)."""

from summarize.engine.compiled import keep_kernels_across_reboots

keep_kernels_across_reboots()  # first: importing torch._dynamo (below) fixes inductor's cache folder

from summarize.engine.diagnostics import LayerReport, NonFiniteStateError, RecurrenceStats, SpanReport  # noqa: E402
from summarize.engine.loading import ModelNotAvailable, load_model, load_tokenizer  # noqa: E402
from summarize.engine.state import KVCache, RecurrentLayerState, Snapshot, State  # noqa: E402

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

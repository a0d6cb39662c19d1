"""The engine: recurrent-state language models in pure PyTorch (design §2-§5)."""

from summarize.engine.compiled import keep_kernels_across_reboots

keep_kernels_across_reboots()  # first: importing torch._dynamo (below) fixes inductor's cache folder

from summarize.engine.diagnostics import LayerReport, NonFiniteStateError, SpanReport
from summarize.engine.loading import ModelNotAvailable, load_model
from summarize.engine.state import KVCache, RecurrentLayerState, Snapshot, State

__all__ = [
    "KVCache",
    "LayerReport",
    "ModelNotAvailable",
    "NonFiniteStateError",
    "RecurrentLayerState",
    "Snapshot",
    "SpanReport",
    "State",
    "load_model",
]

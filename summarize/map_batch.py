"""How many chunks' notes map-reduce decodes together, from what one row's state costs."""

from __future__ import annotations

# Decoding is memory-bound, so a batch costs about what one row does. Rows are added while their
# states (recurrent + KV) stay within a small share of the weights, so a long document does not
# raise peak memory much above a short one's.
MAX_MAP_BATCH = 8
MAP_BATCH_MEMORY_SHARE = 0.08
PROMPT_TOKENS = 256  # the instruction and question around a chunk


def map_batch_size(model, chunk_tokens: int) -> int:
    """How many chunk states fit in MAP_BATCH_MEMORY_SHARE of the weight bytes (1 to MAX_MAP_BATCH)."""
    weight_bytes = sum(buffer.nbytes for buffer in model.buffers())  # a tied table counts once
    probe = model.new_state(1)
    row_bytes = probe.recurrent_nbytes + probe.bytes_per_token * (chunk_tokens + PROMPT_TOKENS)
    return max(1, min(MAX_MAP_BATCH, int(MAP_BATCH_MEMORY_SHARE * weight_bytes // row_bytes)))

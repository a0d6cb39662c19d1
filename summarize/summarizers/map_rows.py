"""How many chunks' notes map-reduce decodes together: as many as a fixed memory budget holds.

Decoding one token reads every weight whatever the batch, so rows decoded together come almost
free (docs/performance.md has the figures). Each row holds its own state
(recurrent matrices, plus the attention layers' keys for the instruction, the chunk and the notes).
The budget bounds the states of one batch, and it does not depend on the document's length: a
long document runs more batches, not bigger ones, so its peak memory is a short one's.
"""

from __future__ import annotations

from summarize.settings import DEFAULT_BATCH_MEMORY

MAX_MAP_BATCH = 8  # more rows than this gain little more tokens/s
PROMPT_TOKENS = 256  # the instruction and question around a chunk
NOTES_TOKENS = 160  # the most notes a row writes (the largest band, NOTES_WORDS, at the summarizer's tokens per word, rounded up)


def map_batch_size(source, chunk_tokens: int, budget: int = DEFAULT_BATCH_MEMORY) -> int:
    """How many chunk states fit in `budget` bytes (1 to MAX_MAP_BATCH); `source` makes them (the
    model, or a session, whose states may carry the MTP head's cache too)."""
    probe = source.new_state(1)
    return max(1, min(MAX_MAP_BATCH, budget // row_bytes(probe, chunk_tokens)))


def row_bytes(state, chunk_tokens: int) -> int:
    """What one row's state takes once it has read its chunk and written its notes."""
    return state.recurrent_nbytes + state.bytes_per_token * (PROMPT_TOKENS + chunk_tokens + NOTES_TOKENS)



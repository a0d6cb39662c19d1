"""How many tokens the chunked recurrences take at once: what both chunk forms share."""

from __future__ import annotations

import torch

from summarize.engine.ops import machine

# Token x head rows per block of chunks on an accelerator, where fewer and larger launches win. On
# a CPU, the machine policy's: enough for efficient batched products, few enough that a block's
# intermediates stay in cache.
BLOCK_TOKEN_HEADS_ACCELERATOR = 1 << 17


def block_tokens(device: torch.device, rows_per_token: int, chunk_size: int) -> int:
    """Tokens per block (a multiple of `chunk_size`) for `rows_per_token` (batch x heads) rows."""
    rows = machine.POLICY.chunk_token_heads if device.type == "cpu" else BLOCK_TOKEN_HEADS_ACCELERATOR
    return chunk_size * max(1, rows // (rows_per_token * chunk_size))

"""How many tokens the chunked recurrences take at once: what both chunk forms share."""

from __future__ import annotations

import torch

# Token x head rows per block of chunks. On CPU: enough for efficient batched products, few enough
# that a block's intermediates stay in cache (measured best around 2048 on a 2-core machine).
# On an accelerator, fewer and larger launches win.
BLOCK_TOKEN_HEADS_CPU = 2048
BLOCK_TOKEN_HEADS_ACCELERATOR = 1 << 17


def block_tokens(device: torch.device, rows_per_token: int, chunk_size: int) -> int:
    """Tokens per block (a multiple of `chunk_size`) for `rows_per_token` (batch x heads) rows."""
    rows = BLOCK_TOKEN_HEADS_CPU if device.type == "cpu" else BLOCK_TOKEN_HEADS_ACCELERATOR
    return chunk_size * max(1, rows // (rows_per_token * chunk_size))

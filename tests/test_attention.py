"""One query per row over a KV cache (a decode step's attention on a CPU), against torch's attention.

The cache is read as `KVCache.append` hands it over: the valid prefix of a larger buffer, with
grouped-query heads (4 query heads per key head) and, in some rows, hidden positions (a draft's
rejected tokens) that no query may see.

Tolerance: fp32 within 1e-5 of the largest output; bf16 within 1e-2 (the output is rounded to
bf16, about 4e-3; the scores are summed in fp32).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from summarize.engine.ops.attention import attend_one_token

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
ROWS, HEADS, KV_HEADS, DIM, LENGTH, CAPACITY = 3, 8, 2, 64, 37, 64


def cache(dtype: torch.dtype, hide: bool):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(ROWS, HEADS, 1, DIM, generator=gen).to(dtype)
    keys, values = (torch.randn(ROWS, KV_HEADS, CAPACITY, DIM, generator=gen).to(dtype)[:, :, :LENGTH] for _ in range(2))
    hidden = None
    if hide:
        hidden = torch.zeros(ROWS, LENGTH, dtype=torch.bool)
        hidden[1, 20:30] = True  # one row's rejected draft
    return q, keys, values, hidden


def torchs_attention(q, keys, values, hidden):
    """torch's scaled dot-product attention in fp32, each key head repeated for its query heads."""
    group = q.shape[1] // keys.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (keys, values))
    mask = None if hidden is None else ~hidden[:, None, None, :]
    return F.scaled_dot_product_attention(q.float(), k, v, attn_mask=mask)


def assert_close(got, want, dtype):
    assert got.shape == want.shape and got.dtype == dtype
    assert (got.float() - want).abs().max() <= TOLERANCE[dtype] * want.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hide", [False, True])
def test_one_query_per_row_is_torchs_attention(dtype, hide):
    q, keys, values, hidden = cache(dtype, hide)
    assert_close(attend_one_token(q, keys, values, hidden), torchs_attention(q, keys, values, hidden), dtype)


def test_hidden_positions_are_never_seen():
    q, keys, values, hidden = cache(torch.float32, hide=True)
    changed = values.clone()
    changed[1, :, 20:30] += 100.0  # what only the hidden positions hold
    assert torch.equal(attend_one_token(q, keys, changed, hidden)[1], attend_one_token(q, keys, values, hidden)[1])

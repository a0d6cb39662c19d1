"""torch's CPU int4 packing: the block of rows it packs together on this CPU, codes packed in
that layout, and the codes read back out of it.

For each input channel a block of b rows holds b/2 bytes whose low nibbles are its rows 0..b/2−1
and high nibbles the rest. b depends on the kernels torch picked for the CPU (64 with AVX-512, 32
with AVX2), so it is found by packing a pattern and reading it back.
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCKS_TRIED = (64, 32, 16)  # rows per block, the largest first


def packing_block_rows() -> int | None:
    """Rows per block of torch's CPU int4 packing here (None: no layout we read, so no int4)."""
    rows = torch.arange(max(BLOCKS_TRIED))
    codes = torch.stack([rows % 16, rows // 16], dim=1).int()  # every row told apart by its two codes
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    except (RuntimeError, AttributeError):
        return None
    return next((b for b in BLOCKS_TRIED if torch.equal(int4_codes(packed, b), codes.to(torch.uint8))), None)


def pack_int4_codes(codes: Tensor, block_rows: int) -> Tensor:
    """codes [N, K] (0..15, in any dtype) → [N, K/2] uint8 laid out as torch's CPU packing with
    blocks of `block_rows` rows: the inverse of `int4_codes`. The same bytes as
    `_convert_weight_to_int4pack_for_cpu`, which takes the codes as int32 only and packs them more
    slowly (tests/test_quantize.py)."""
    N, K = codes.shape
    halves = codes.to(torch.uint8).view(N // block_rows, 2, block_rows // 2, K)  # a block's low, high rows
    return (halves[:, 0] | (halves[:, 1] << 4)).transpose(1, 2).contiguous().view(N, K // 2)


def int4_codes(packed: Tensor, block_rows: int, ids: Tensor | None = None) -> Tensor:
    """The codes 0..15 of the rows `ids` [n] (all rows when None) of a weight packed in blocks of
    `block_rows` rows → [n, K] uint8."""
    N, K = packed.shape[0], packed.shape[1] * 2
    b = block_rows
    blocks = packed.view(N // b, K, b // 2)
    if ids is None:
        codes = torch.cat([blocks & 0xF, blocks >> 4], dim=2)  # [N/b, K, b]: rows 0..b−1 of each block
        return codes.transpose(1, 2).reshape(N, K)
    within = ids % b
    bytes_ = blocks[ids // b, :, within % (b // 2)]  # [n, K]
    high = (within >= b // 2)[:, None]
    return torch.where(high, bytes_ >> 4, bytes_ & 0xF)

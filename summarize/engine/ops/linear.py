"""x @ Wᵀ in every form the engine needs: eager, inside a compiled decode step, and int8.

Eagerly, `linear` is `F.linear`. Inside `torch.compile`, for one or two input rows, it is a
multiply-and-sum over the input dimension that inductor turns into one pass over the weight rows:
torch's CPU GEMM is built for many rows and reads the weights slowly for one. With more rows the
compiled steps call torch's GEMM as eager code does.

`Projection` holds one weight matrix, either in the model's dtype or as int8 with one scale per
output row (weight-only quantization: activations stay in the model's dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

INT8_MAX = 127
# Up to this many input rows a compiled step streams the weights itself; with more, the per-row
# work makes the loop compute-bound and torch's GEMM wins.
STREAMED_MAX_ROWS = 2
INT8_PACKED_MAX_ROWS = 16  # up to this many input rows, eager int8 uses torch's packed int8 GEMV
QUANTIZE_BLOCK_ROWS = 8192  # rows quantized at a time: bounded fp32 temporaries


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., K] times weight [N, K] transposed → [..., N] in x's dtype, accumulated in fp32."""
    if not torch.compiler.is_compiling() or x.numel() // x.shape[-1] > STREAMED_MAX_ROWS:
        return F.linear(x, weight)
    return _streamed(x, weight, None)


def linear_int8(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """x [..., K] times (weight int8 [N, K] · scale [N]) transposed → [..., N] in x's dtype."""
    if torch.compiler.is_compiling() and x.numel() // x.shape[-1] <= STREAMED_MAX_ROWS:
        return _streamed(x, weight, scale)
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] <= INT8_PACKED_MAX_ROWS and x.device.type == "cpu":
        out = torch._weight_int8pack_mm(rows.contiguous(), weight, scale)
        return out.reshape(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight * scale[:, None])  # many rows: compute-bound, dequantize first


def rows_fp32(x: Tensor) -> Tensor:
    """x [..., K] as fp32 rows [rows, K], stored once before the projection's loop (compiled only).

    Left to itself inductor inlines whatever produced x (an RMSNorm, say) into the loop over the
    weight rows and recomputes it for every row; forcing a stride order makes it store the rows
    first, without the dispatch cost a custom op would add.
    """
    rows = x.reshape(-1, x.shape[-1]).float()
    return torch.ops.prims.inductor_force_stride_order(rows, rows.stride())


def _streamed(x: Tensor, weight: Tensor, scale: Tensor | None) -> Tensor:
    rows = rows_fp32(x)
    # [N, rows, K] summed over K: the loop runs over weight rows outermost, so each one is read
    # from memory once however many input rows there are.
    out = (weight.float()[:, None, :] * rows[None]).sum(-1)
    if scale is not None:
        out = out * scale.float()[:, None]
    return out.t().reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)


class Projection(nn.Module):
    """A weight [N, K] applied as x @ Wᵀ (and, for an embedding table, looked up by row)."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scale", None)  # [N] in the model's dtype once the weight is int8

    def forward(self, x: Tensor) -> Tensor:
        if self.scale is None:
            return linear(x, self.weight)
        return linear_int8(x, self.weight, self.scale)

    def rows(self, ids: Tensor) -> Tensor:
        """Rows of the weight at `ids` (an embedding lookup), in the model's dtype."""
        if self.scale is None:
            return F.embedding(ids, self.weight)
        return F.embedding(ids, self.weight) * self.scale[ids, None]

    def quantize_int8(self) -> None:
        """Store the weight as int8, symmetric per output row; the scale is exact in its dtype.

        Works through the rows in blocks, so the fp32 temporaries stay small (the 248K-row head
        would otherwise need a gigabyte of them).
        """
        if self.scale is not None:
            return
        weight, dtype = self.weight, self.weight.dtype
        quantized = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
        scale = torch.empty(weight.shape[0], dtype=dtype, device=weight.device)
        for start in range(0, weight.shape[0], QUANTIZE_BLOCK_ROWS):
            block = weight[start : start + QUANTIZE_BLOCK_ROWS].float()
            absmax = block.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
            block_scale = (absmax / INT8_MAX).to(dtype)  # rounded to the model's dtype first ...
            block.div_(block_scale.float()[:, None]).round_().clamp_(-INT8_MAX, INT8_MAX)  # ... then used exactly
            quantized[start : start + QUANTIZE_BLOCK_ROWS] = block
            scale[start : start + QUANTIZE_BLOCK_ROWS] = block_scale
        self.weight, self.scale = quantized, scale

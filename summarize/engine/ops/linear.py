"""x @ Wᵀ in every form the engine needs: eager, inside a compiled decode step, and int8.

Eagerly, `linear` is `F.linear`. Inside `torch.compile`, for one or two input rows, it is a
multiply-and-sum over the input dimension that inductor turns into one pass over the weight rows:
torch's CPU GEMM is built for many rows and reads the weights slowly for one. With more rows the
compiled steps call torch's GEMM as eager code does.

`Projection` holds one weight matrix, either in the model's dtype or as int8 with one scale per
output row (weight-only quantization: activations stay in the model's dtype). `Int8Rows` is that
int8 form on its own, as a weight file that is already quantized (GGUF's Q8_0) hands it over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


def quantize_rows(rows: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """fp32 rows [n, K] → int8 [n, K] and one scale per row [n] in `dtype`, symmetric: the scale
    is rounded to `dtype` first and then used exactly. `rows` is overwritten."""
    absmax = rows.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
    scale = (absmax / INT8_MAX).to(dtype)
    rows.div_(scale.float()[:, None]).round_().clamp_(-INT8_MAX, INT8_MAX)
    return rows.to(torch.int8), scale


@dataclass(frozen=True)
class Int8Rows:
    """A weight [N, K] as int8 `values` times one `scale` per row [N]: what a quantized Projection keeps."""

    values: Tensor  # int8 [N, K]
    scale: Tensor  # [N], in the model's dtype

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Int8Rows:
        """On `device`, the scale in `dtype` (the values stay int8)."""
        return Int8Rows(self.values.to(device=device), self.scale.to(device=device, dtype=dtype))

    def dequantized(self, dtype: torch.dtype) -> Tensor:
        return (self.values.float() * self.scale.float()[:, None]).to(dtype)


class Projection(nn.Module):
    """A weight [N, K] applied as x @ Wᵀ (and, for an embedding table, looked up by row)."""

    def __init__(self, weight: Tensor | Int8Rows) -> None:
        super().__init__()
        quantized = isinstance(weight, Int8Rows)
        self.register_buffer("weight", weight.values if quantized else weight)
        self.register_buffer("scale", weight.scale if quantized else None)  # [N] in the model's dtype once int8

    @classmethod
    def concat(cls, parts: Sequence[Tensor | Int8Rows]) -> Projection:
        """One projection of `parts` stacked by rows: int8 if every part is, else all in the model's
        dtype (an int8 part is widened: a mix cannot share one kernel)."""
        if all(isinstance(part, Int8Rows) for part in parts):
            return cls(Int8Rows(torch.cat([p.values for p in parts]), torch.cat([p.scale for p in parts])))
        dtype = next(part.dtype for part in parts if isinstance(part, Tensor))
        return cls(torch.cat([p.dequantized(dtype) if isinstance(p, Int8Rows) else p for p in parts]))

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
            block = weight[start : start + QUANTIZE_BLOCK_ROWS].float()  # fp32 weights: overwritten, then dropped
            quantized[start : start + QUANTIZE_BLOCK_ROWS], scale[start : start + QUANTIZE_BLOCK_ROWS] = quantize_rows(block, dtype)
        self.weight, self.scale = quantized, scale

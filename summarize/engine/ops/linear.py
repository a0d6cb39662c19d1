"""x @ Wᵀ in every form the engine needs: eager, inside a compiled decode step, and int8.

Which form a CPU product takes is the machine policy's (`machine.POLICY`, docs/kernel-policy.md),
timed on the machine where it can be (`ops/calibration.py`). In fp32 on a CPU, compiled or not,
`linear` is mostly torch's GEMM, asked in the order (x @ Wᵀ or W @ xᵀ) that reads the weight fastest
for the number of rows; where the policy says so, a compiled step of a few rows streams the weights
itself.
In bf16, inside `torch.compile`, for one or two input rows, it is a multiply-and-sum over the
input dimension that inductor turns into one pass over the weight rows: torch's bf16 GEMM is built
for many rows and reads the weights slowly for one. With more rows, or eagerly, it is torch's GEMM.

`Projection` holds one weight matrix: in the model's dtype, as int8 with one scale per output row,
or as int4 with a scale and a zero per group of input channels (weight-only quantization:
activations stay in the model's dtype). int4 runs on torch's CPU int4 kernel for a few rows, which
reads half a byte per weight; with more rows than the policy gives it, it dequantizes and calls the
GEMM.
`Int8Rows` is the int8 form on its own, as a weight file that is already quantized (GGUF's Q8_0)
hands it over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx.experimental.symbolic_shapes import has_static_value

from summarize.engine.ops import machine
from summarize.engine.ops.int4_packing import int4_codes

INT8_MAX = 127
# Up to this many input rows a compiled step in bf16 (or on a GPU) streams the weights itself; with
# more, the per-row work makes the loop compute-bound and torch's GEMM wins.
STREAMED_MAX_ROWS = 2
QUANTIZE_BLOCK_ROWS = 1024  # rows quantized at a time: fp32 temporaries small enough to stay in cache
INT4_LEVELS = 15  # codes 0..15, read as (code - 8) · scale + zero by torch's kernel
INT4_GROUP = 64  # input channels per scale and zero (torch's kernel takes 32, 64, 128 or 256)


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., K] times weight [N, K] transposed → [..., N] in x's dtype, accumulated in fp32."""
    rows = x.numel() // x.shape[-1]
    if x.dtype == torch.float32 and x.device.type == "cpu":
        policy = machine.POLICY
        streams = policy.streamed_fp32_max_rows
        if streams and torch.compiler.is_compiling() and has_static_value(rows) and rows <= streams:
            return streamed(x, weight)
        if policy.weight_first_min_rows <= rows <= policy.weight_first_max_rows:
            return weight_first(x, weight)
        return F.linear(x, weight)
    if torch.compiler.is_compiling() and rows <= STREAMED_MAX_ROWS:
        return streamed(x, weight)
    return F.linear(x, weight)


def linear_int8(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """x [..., K] times (weight int8 [N, K] · scale [N]) transposed → [..., N] in x's dtype.

    On a CPU:
    - in fp32, eagerly, any number of rows: the weight widened a block of rows at a time, each
      block's product taken while it is in cache (faster than dequantizing the whole weight first);
    - in fp32, inside a compiled step, a few rows: a streamed loop that widens each weight as it
      reads it, as exact as fp32 and memory-bound (torch's int8 kernel is slow with fp32 rows);
    - in bf16, a few rows, compiled or not: torch's int8 kernel (with AMX it reads int8 faster
      than a streamed loop does);
    - otherwise (more rows are compute-bound): dequantize, then GEMM."""
    rows = x.reshape(-1, x.shape[-1])
    policy = machine.POLICY
    on_cpu, few = x.device.type == "cpu", rows.shape[0] <= policy.int8_packed_max_rows
    if on_cpu and x.dtype == torch.float32 and not torch.compiler.is_compiling():
        return int8_widened(rows, weight, scale, policy.widen_block_rows).reshape(*x.shape[:-1], weight.shape[0])
    if on_cpu and few and x.dtype == torch.float32:
        return streamed(x, weight, scale)
    if on_cpu and few:
        return int8_kernel(rows, weight, scale).reshape(*x.shape[:-1], weight.shape[0])
    return int8_dequantized(x, weight, scale)


def linear_int4(x: Tensor, packed: Tensor, scale_and_zero: Tensor, group: int) -> Tensor:
    """x [..., K] times the int4 weight (`packed` [N, K/2] uint8, `scale_and_zero` [K/group, N, 2]
    bf16) transposed → [..., N] in x's dtype. The kernel reads x in bf16."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] > machine.POLICY.int4_kernel_max_rows or x.device.type != "cpu":
        return int4_dequantized(x, packed, scale_and_zero, group)
    return int4_kernel(rows, packed, scale_and_zero, group).reshape(*x.shape[:-1], packed.shape[0])


# The products the dispatches above choose between (and the calibration times): x [rows, K] → [rows, N]


def weight_first(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., K] @ weight [N, K]ᵀ asked of torch's GEMM as W @ xᵀ, the weight first."""
    rows = x.numel() // x.shape[-1]
    return torch.mm(weight, x.reshape(rows, x.shape[-1]).t()).t().reshape(*x.shape[:-1], weight.shape[0])


def int8_widened(rows: Tensor, weight: Tensor, scale: Tensor, block_rows: int) -> Tensor:
    """fp32 rows: the int8 weight widened `block_rows` rows at a time, each block's product taken
    while it is in cache (faster than dequantizing the whole weight first)."""
    out = torch.empty(rows.shape[0], weight.shape[0])
    for start in range(0, weight.shape[0], block_rows):
        block = slice(start, start + block_rows)
        torch.mul(F.linear(rows, weight[block].float()), scale[block], out=out[:, block])
    return out


def int8_kernel(rows: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """torch's int8 kernel: reads the weight in one pass."""
    return torch._weight_int8pack_mm(rows.contiguous(), weight, scale)


def int8_dequantized(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    return F.linear(x, weight * scale[:, None])


def int4_kernel(rows: Tensor, packed: Tensor, scale_and_zero: Tensor, group: int) -> Tensor:
    """torch's CPU int4 kernel: reads half a byte per weight, and x in bf16."""
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16).contiguous(), packed, group, scale_and_zero)
    return out.to(rows.dtype)


def int4_dequantized(x: Tensor, packed: Tensor, scale_and_zero: Tensor, group: int) -> Tensor:
    return F.linear(x, dequantize_int4(packed, scale_and_zero, group, x.dtype))


def dequantize_int4(packed: Tensor, scale_and_zero: Tensor, group: int, dtype: torch.dtype, ids: Tensor | None = None) -> Tensor:
    """The weight's rows `ids` (all when None) as [n, K] in `dtype`: (code − 8) · scale + zero per group."""
    codes = int4_codes(packed, machine.POLICY.int4_block_rows, ids)
    n, K = codes.shape
    pairs = scale_and_zero if ids is None else scale_and_zero[:, ids]  # [K/group, n, 2]
    scale, zero = pairs[..., 0].t()[..., None], pairs[..., 1].t()[..., None]  # [n, K/group, 1]
    weight = (codes.view(n, K // group, group).to(dtype) - 8) * scale.to(dtype) + zero.to(dtype)
    return weight.view(n, K)


def rows_fp32(x: Tensor) -> Tensor:
    """x [..., K] as fp32 rows [rows, K], stored once before the projection's loop (compiled only).

    Left to itself inductor inlines whatever produced x (an RMSNorm, say) into the loop over the
    weight rows and recomputes it for every row; forcing a stride order makes it store the rows
    first, without the dispatch cost a custom op would add.
    """
    rows = x.reshape(-1, x.shape[-1]).float()
    return torch.ops.prims.inductor_force_stride_order(rows, rows.stride())


def streamed(x: Tensor, weight: Tensor, scale: Tensor | None = None) -> Tensor:
    """x [..., K] times weight [N, K] (int8 with `scale` [N]) transposed, inside a compiled step: a
    loop that reads (and widens) each weight once, whatever the rows."""
    rows = rows_fp32(x)
    wide = weight.float()
    if has_static_value(rows.shape[0]):
        # one reduction per input row over the same weights: inductor fuses them into one loop
        # that reads (and widens) each weight once, however many rows there are
        out = torch.stack([(wide * row).sum(-1) for row in rows], dim=1)
    else:  # a span of symbolic length (a verify graph): one reduction over [N, rows, K]
        out = (wide[:, None, :] * rows[None]).sum(-1)
    if scale is not None:  # int8 rows
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
        is_int8 = isinstance(weight, Int8Rows)
        self.register_buffer("weight", weight.values if is_int8 else weight)  # [N, K]; int8 [N, K]; int4 packed [N, K/2] uint8
        self.register_buffer("scale", weight.scale if is_int8 else None)  # int8: [N] in the model's dtype
        self.register_buffer("scale_and_zero", None)  # int4: [K/group, N, 2] bf16
        self.group = 0  # int4: input channels per scale and zero
        self.dtype = weight.scale.dtype if is_int8 else weight.dtype  # what it computes in

    @classmethod
    def concat(cls, parts: Sequence[Tensor | Int8Rows]) -> Projection:
        """One projection of `parts` stacked by rows: int8 if every part is, else all in the model's
        dtype (an int8 part is widened: a mix cannot share one kernel)."""
        if all(isinstance(part, Int8Rows) for part in parts):
            return cls(Int8Rows(torch.cat([p.values for p in parts]), torch.cat([p.scale for p in parts])))
        dtype = next(part.dtype for part in parts if isinstance(part, Tensor))
        return cls(torch.cat([p.dequantized(dtype) if isinstance(p, Int8Rows) else p for p in parts]))

    def forward(self, x: Tensor) -> Tensor:
        if self.scale_and_zero is not None:
            return linear_int4(x, self.weight, self.scale_and_zero, self.group)
        if self.scale is None:
            return linear(x, self.weight)
        return linear_int8(x, self.weight, self.scale)

    def rows(self, ids: Tensor) -> Tensor:
        """Rows of the weight at `ids` (an embedding lookup), in the model's dtype."""
        if self.scale_and_zero is not None:
            flat = dequantize_int4(self.weight, self.scale_and_zero, self.group, self.dtype, ids.reshape(-1))
            return flat.view(*ids.shape, -1)
        if self.scale is None:
            return F.embedding(ids, self.weight)
        return F.embedding(ids, self.weight) * self.scale[ids, None]

    def quantize(self, mode: str) -> None:
        """"int8" or "int4" (int8 where the int4 kernel cannot take the shape)."""
        if mode == "int4" and self.quantize_int4():
            return
        self.quantize_int8()

    def quantize_int8(self) -> None:
        """Store the weight as int8, symmetric per output row; the scale is exact in its dtype.

        Works through the rows in blocks, so the fp32 temporaries stay small (the 248K-row head
        would otherwise need a gigabyte of them).
        """
        if self.scale is not None or self.scale_and_zero is not None:
            return
        weight, dtype = self.weight, self.weight.dtype
        quantized = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
        scale = torch.empty(weight.shape[0], dtype=dtype, device=weight.device)
        for start in range(0, weight.shape[0], QUANTIZE_BLOCK_ROWS):
            block = weight[start : start + QUANTIZE_BLOCK_ROWS].float()  # fp32 weights: overwritten, then dropped
            quantized[start : start + QUANTIZE_BLOCK_ROWS], scale[start : start + QUANTIZE_BLOCK_ROWS] = quantize_rows(block, dtype)
        self.weight, self.scale = quantized, scale

    def quantize_int4(self, group: int = INT4_GROUP) -> bool:
        """Store the weight as int4 codes with a bf16 scale and zero per `group` input channels
        (asymmetric, round to nearest: each group's minimum and maximum are exact up to bf16).

        Returns False, and keeps the weight as it is, where torch's CPU kernel cannot take its
        shape (rows not a multiple of its block, or input channels not a multiple of `group`) or
        device.
        """
        N, K = self.weight.shape
        if self.scale is not None or self.scale_and_zero is not None:
            return self.scale_and_zero is not None
        if self.weight.device.type != "cpu" or K % group:
            return False
        block_rows = machine.POLICY.int4_block_rows
        if block_rows is None or N % block_rows:
            return False
        packed = torch.empty(N, K // 2, dtype=torch.uint8)
        scale_and_zero = torch.empty(K // group, N, 2, dtype=torch.bfloat16)
        for start in range(0, N, QUANTIZE_BLOCK_ROWS):  # a multiple of the block: packed blocks stay whole
            rows = slice(start, start + QUANTIZE_BLOCK_ROWS)
            block = self.weight[rows].float().view(-1, K // group, group)  # fp32 copy: overwritten in place below
            low, high = torch.aminmax(block, dim=-1)
            scale = ((high - low) / INT4_LEVELS).clamp_min(torch.finfo(torch.float32).tiny).bfloat16().float()
            zero = (low + 8 * scale).bfloat16().float()  # code 0 reads as the group's minimum
            codes = block.sub_(zero[..., None]).div_(scale[..., None]).add_(8).round_().clamp_(0, INT4_LEVELS)
            packed[rows] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.view(-1, K).to(torch.int32), 1)
            scale_and_zero[:, rows] = torch.stack([scale, zero], -1).transpose(0, 1)
        self.weight = packed
        self.scale_and_zero, self.group = scale_and_zero, group
        return True


QUANTIZATIONS = ("int8", "int4")  # what `Projection.quantize` takes


def quantized(module: nn.Module, mode: str | None) -> nn.Module:
    """`module` with every `Projection` in it quantized to `mode` (None: as it is). Called on each
    part of a model as it is built, so the full-precision weights never exist all at once."""
    if mode is not None:
        for part in module.modules():
            if isinstance(part, Projection):
                part.quantize(mode)
    return module

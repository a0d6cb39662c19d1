"""x @ Wᵀ in every form the engine needs: eager, inside a compiled decode step, and int8.

In fp32 on a CPU, compiled or not, `linear` is mostly torch's GEMM, asked in the order that reads the
weight fastest for the number of rows: x @ Wᵀ for 1 to 3 rows (as fast as one row), W @ xᵀ up to a
few dozen, x @ Wᵀ for more. Where torch runs AVX2 kernels (no AVX-512), MKL reads a few rows slower:
there a compiled step of up to 9 rows streams the weights itself, and W @ xᵀ starts at two rows.
In bf16, inside `torch.compile`, for one or two input rows, it is a multiply-and-sum over the
input dimension that inductor turns into one pass over the weight rows: torch's bf16 GEMM is built
for many rows and reads the weights slowly for one. With more rows, or eagerly, it is torch's GEMM.

`Projection` holds one weight matrix: in the model's dtype, as int8 with one scale per output row,
or as int4 with a scale and a zero per group of input channels (weight-only quantization:
activations stay in the model's dtype). int4 runs on torch's CPU int4 kernel for a few rows, which
reads half a byte per weight; with many rows it dequantizes and calls the GEMM, which is faster
there (figures: bench/README.md).
`Int8Rows` is the int8 form on its own, as a weight file that is already quantized (GGUF's Q8_0)
hands it over.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx.experimental.symbolic_shapes import has_static_value

INT8_MAX = 127
# Up to this many input rows a compiled step in bf16 (or on a GPU) streams the weights itself; with
# more, the per-row work makes the loop compute-bound and torch's GEMM wins.
STREAMED_MAX_ROWS = 2
# In fp32 on a CPU whose kernels torch runs with AVX-512, torch's GEMM (MKL) reads a weight as fast
# for 3 rows as for 1 when asked for x @ Wᵀ (a 2-core Xeon: 22-24 GB/s, where a streamed loop reads
# 13-18); from 4 rows that form drops to 7-12 GB/s, and W @ xᵀ, the weight first, holds 12-14 up to
# a few dozen rows (the 0.8B head at 9 rows: 82 against 144 ms); at 72 rows x @ Wᵀ wins again.
WEIGHT_FIRST_MIN_ROWS = 4
WEIGHT_FIRST_MAX_ROWS = 32
# With AVX2 kernels (no AVX-512) it is otherwise (a 2-core AMD EPYC, Zen 3, 0.8B's MLP matrix):
# MKL's x @ Wᵀ reads 14-15 GB/s at one row and 6-8 at 2 to 9 rows, W @ xᵀ 14-19 at 2 to 4 rows;
# a compiled streamed loop reads 18-23 GB/s at 1 to 4 rows and 13-15 at 9, then falls behind
# (8-9 at 12 rows, 4 at 16). So there W @ xᵀ from two rows, and compiled steps of up to this many
# rows stream the weights themselves (a 0.8B decode step: 208-228 → 143-155 ms at one row).
AVX2_WEIGHT_FIRST_MIN_ROWS = 2
AVX2_STREAMED_MAX_ROWS = 9
CPU_KERNELS = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2", ...: what torch runs here
INT8_PACKED_MAX_ROWS = 16  # up to this many input rows, int8 reads its weight in one pass (linear_int8)
WIDEN_BLOCK_ROWS = 512  # int8 rows widened to fp32 at a time by an eager fp32 product: 2 MB, in cache
QUANTIZE_BLOCK_ROWS = 8192  # rows quantized at a time: bounded fp32 temporaries
INT4_LEVELS = 15  # codes 0..15, read as (code - 8) · scale + zero by torch's kernel
INT4_GROUP = 64  # input channels per scale and zero (torch's kernel takes 32, 64, 128 or 256)
# Up to this many input rows the int4 kernel; with more (prefill), dequantize and GEMM. The kernel's
# time grows with the rows (0.8B's MLP matrix, 2 threads: 2 ms at 8 rows, 31 at 128); dequantizing
# costs about a 1,000-row GEMM's time, so past a few dozen rows it wins.
INT4_KERNEL_MAX_ROWS = 64


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., K] times weight [N, K] transposed → [..., N] in x's dtype, accumulated in fp32."""
    rows = x.numel() // x.shape[-1]
    if x.dtype == torch.float32 and x.device.type == "cpu":
        avx2 = CPU_KERNELS == "AVX2"
        if avx2 and torch.compiler.is_compiling() and has_static_value(rows) and rows <= AVX2_STREAMED_MAX_ROWS:
            return _streamed(x, weight)
        if (AVX2_WEIGHT_FIRST_MIN_ROWS if avx2 else WEIGHT_FIRST_MIN_ROWS) <= rows <= WEIGHT_FIRST_MAX_ROWS:
            return torch.mm(weight, x.reshape(rows, x.shape[-1]).t()).t().reshape(*x.shape[:-1], weight.shape[0])
        return F.linear(x, weight)
    if torch.compiler.is_compiling() and rows <= STREAMED_MAX_ROWS:
        return _streamed(x, weight)
    return F.linear(x, weight)


def linear_int8(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """x [..., K] times (weight int8 [N, K] · scale [N]) transposed → [..., N] in x's dtype.

    On a CPU (figures: a 2-core Xeon without bf16 instructions, 0.8B's MLP matrix):
    - in fp32, eagerly, any number of rows: the weight widened a block of rows at a time, each
      block's product taken while it is in cache (780 µs at one row; 10 ms at 256 rows, where
      dequantizing the whole weight first takes 13);
    - in fp32, inside a compiled step, a few rows: a streamed loop that widens each weight as it
      reads it, as exact as fp32 and memory-bound (179 µs at one row, where torch's int8 kernel
      takes 2,000 with fp32 rows and 370 with bf16 ones);
    - in bf16, a few rows, compiled or not: torch's int8 kernel (on a 2-core Xeon with AMX it reads
      int8 faster than a streamed loop does: a decode step 78-84 → 71-73 ms on the 0.8B shape);
    - otherwise (more rows are compute-bound): dequantize, then GEMM."""
    rows = x.reshape(-1, x.shape[-1])
    on_cpu, few = x.device.type == "cpu", rows.shape[0] <= INT8_PACKED_MAX_ROWS
    if on_cpu and x.dtype == torch.float32 and not torch.compiler.is_compiling():
        out = torch.empty(rows.shape[0], weight.shape[0])
        for start in range(0, weight.shape[0], WIDEN_BLOCK_ROWS):
            block = slice(start, start + WIDEN_BLOCK_ROWS)
            torch.mul(F.linear(rows, weight[block].float()), scale[block], out=out[:, block])
        return out.reshape(*x.shape[:-1], weight.shape[0])
    if on_cpu and few and x.dtype == torch.float32:
        return _streamed(x, weight, scale)
    if on_cpu and few:
        return torch._weight_int8pack_mm(rows.contiguous(), weight, scale).reshape(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight * scale[:, None])


def linear_int4(x: Tensor, packed: Tensor, scale_and_zero: Tensor, group: int) -> Tensor:
    """x [..., K] times the int4 weight (`packed` [N, K/2] uint8, `scale_and_zero` [K/group, N, 2]
    bf16) transposed → [..., N] in x's dtype. The kernel reads x in bf16."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] > INT4_KERNEL_MAX_ROWS or x.device.type != "cpu":
        return F.linear(x, dequantize_int4(packed, scale_and_zero, group, x.dtype))
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16).contiguous(), packed, group, scale_and_zero)
    return out.to(x.dtype).reshape(*x.shape[:-1], packed.shape[0])


@functools.cache
def int4_block_rows() -> int | None:
    """Rows per block of torch's CPU int4 packing (None: no layout we read, so no int4).

    For each input channel a block holds b/2 bytes whose low nibbles are its rows 0..b/2−1 and high
    nibbles the rest. b depends on the kernels torch picked for this CPU: 64 with AVX-512, 32 with
    AVX2. So it is found by packing a pattern and reading it back."""
    rows = torch.arange(64)
    codes = torch.stack([rows % 16, rows // 16], dim=1).int()  # every row told apart by its two codes
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    except (RuntimeError, AttributeError):
        return None
    return next((b for b in (64, 32, 16) if torch.equal(int4_codes(packed, block_rows=b), codes.to(torch.uint8))), None)


def int4_codes(packed: Tensor, ids: Tensor | None = None, block_rows: int | None = None) -> Tensor:
    """The codes 0..15 of the rows `ids` [n] (all rows when None) of a packed int4 weight → [n, K] uint8."""
    N, K = packed.shape[0], packed.shape[1] * 2
    b = block_rows or int4_block_rows()
    blocks = packed.view(N // b, K, b // 2)
    if ids is None:
        codes = torch.cat([blocks & 0xF, blocks >> 4], dim=2)  # [N/b, K, b]: rows 0..b−1 of each block
        return codes.transpose(1, 2).reshape(N, K)
    within = ids % b
    bytes_ = blocks[ids // b, :, within % (b // 2)]  # [n, K]
    high = (within >= b // 2)[:, None]
    return torch.where(high, bytes_ >> 4, bytes_ & 0xF)


def dequantize_int4(packed: Tensor, scale_and_zero: Tensor, group: int, dtype: torch.dtype, ids: Tensor | None = None) -> Tensor:
    """The weight's rows `ids` (all when None) as [n, K] in `dtype`: (code − 8) · scale + zero per group."""
    codes = int4_codes(packed, ids)
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


def _streamed(x: Tensor, weight: Tensor, scale: Tensor | None = None) -> Tensor:
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
        block_rows = int4_block_rows()
        if block_rows is None or N % block_rows:
            return False
        packed = torch.empty(N, K // 2, dtype=torch.uint8)
        scale_and_zero = torch.empty(K // group, N, 2, dtype=torch.bfloat16)
        for start in range(0, N, QUANTIZE_BLOCK_ROWS):  # a multiple of the block: packed blocks stay whole
            rows = slice(start, start + QUANTIZE_BLOCK_ROWS)
            block = self.weight[rows].float().view(-1, K // group, group)
            low, high = block.amin(-1), block.amax(-1)
            scale = ((high - low) / INT4_LEVELS).clamp_min(torch.finfo(torch.float32).tiny).bfloat16().float()
            zero = (low + 8 * scale).bfloat16().float()  # code 0 reads as the group's minimum
            codes = ((block - zero[..., None]) / scale[..., None] + 8).round_().clamp_(0, INT4_LEVELS)
            packed[rows] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.view(-1, K).int(), 1)
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

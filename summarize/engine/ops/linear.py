"""x @ Wᵀ in every form the engine needs: eager, inside a compiled decode step, and int8.

Which form a CPU product takes is the machine policy's (`machine.POLICY`, docs/kernel-policy.md),
timed on the machine where it can be (`ops/calibration.py`). In fp32 on a CPU, compiled or not,
`linear` is mostly torch's GEMM, asked in the order (x @ Wᵀ or W @ xᵀ) that reads the weight fastest
for the number of rows; where the policy says so, a compiled step of a few rows streams the weights
itself.
In bf16, inside `torch.compile`, for one or two input rows, it is a multiply-and-sum over the
input dimension that inductor turns into one pass over the weight rows: torch's bf16 GEMM is built
for many rows and reads the weights slowly for one. With more rows, or eagerly, it is torch's GEMM.

`Projection` holds one weight matrix: in the model's dtype, as int8 with one scale per output row
(`--quantize int8`) or per group of input channels (a GGUF file's Q8_0 and Q6_K), or as int4 with a
scale and a zero per group of input channels (weight-only quantization: activations stay in the
model's dtype). int4 runs on torch's CPU int4 kernel for a few rows, which reads half a byte per
weight; with more rows than the policy gives it, it dequantizes and calls the GEMM.
`Int8Groups` and `Int4Groups` are the grouped forms on their own, as a weight file that is already
quantized (GGUF's Q8_0, Q6_K; Q4_0, Q4_1, Q4_K) hands them over, exactly as it stores them.

A full-precision projection may also hold an int4 copy of its weight (`add_int4_copy`), read by the
steps that generate tokens (`generating_tokens`: decode and verify) for batches of up to the
policy's `int4_copy_max_batch` sequences, while reading a prompt (and a larger batch) takes the
weight as stored: torch's GEMM or int8 products are fast for many rows, the int4 kernel reads a
quarter of bf16's bytes for one. Every token a batch generates then comes from one form, whether
decoded one at a time or verified in a span, so speculative and plain decoding still write the
same text. For the same reason, where the copies generate, an int8 weight (a scale per row, as
`auto` stores one) rounds x to int8 in generating only for a batch past the copy's, never by the
rows of one product.

Where the policy says so (`int8_prepacked`), such an int8 weight that has an int4 copy is held
prepacked for oneDNN's int8 kernel instead (`Projection.prepack_int8`): torch's `_int_mm` takes a plain weight and lays it out
for its kernel at every call, which costs more than the product itself for a few rows. A prepacked
weight is always read with x rounded to int8, whatever the rows.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx.experimental.symbolic_shapes import has_static_value

from summarize.engine.ops import machine
from summarize.engine.ops.int4_packing import int4_codes, pack_int4_codes

INT8_MAX = 127
# Up to this many input rows a compiled step in bf16 (or on a GPU) streams the weights itself; with
# more, the per-row work makes the loop compute-bound and torch's GEMM wins.
STREAMED_MAX_ROWS = 2
QUANTIZE_BLOCK_ROWS = 1024  # rows quantized at a time: fp32 temporaries small enough to stay in cache
INT4_LEVELS = 15  # codes 0..15, read as (code - 8) · scale + zero by torch's kernel
INT4_GROUP = 64  # input channels per scale and zero (torch's kernel takes 32, 64, 128 or 256)
INT8_ZERO = 128  # oneDNN's int8 kernel reads x as unsigned codes: an int8 code plus this


_generating = 0  # inside `generating_tokens`: the sequences of the batch (0 outside)


@contextmanager
def generating_tokens(batch: int) -> Iterator[None]:
    """The steps inside generate tokens for a batch of `batch` sequences (decode, verify):
    projections with an int4 copy read it, for a batch of up to the policy's `int4_copy_max_batch`
    sequences; a larger batch reads the weights, as many rows of a prompt do. Decided by the batch,
    not by the rows of a product, so that a verify span computes each token as a decode step of the
    same batch does."""
    global _generating
    before, _generating = _generating, batch
    try:
        yield
    finally:
        _generating = before


def generating_batch() -> int:
    """The batch `generating_tokens` was entered with (0 outside it)."""
    return _generating


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


def linear_int8(x: Tensor, weight: Tensor, scale: Tensor, round_x: bool = True) -> Tensor:
    """x [..., K] times (weight int8 [N, K] · scale) transposed → [..., N] in x's dtype; `scale` is
    one per row [N] or one per group of input channels [N, K/group] (fp16 or fp32).

    On a CPU:
    - with a scale per row, more rows than the policy's int8 kernel takes, where the policy says
      so (`int8_activations`) and `round_x`: x rounded to int8 too, multiplied in int8;
    - in fp32 (with group scales in any dtype), eagerly, any number of rows: the weight widened a
      block of rows at a time, each block's product taken while it is in cache (faster than
      dequantizing the whole weight first);
    - in fp32 (with group scales in any dtype), inside a compiled step, a few rows: a streamed loop
      that widens each weight (and applies its group's scale) as it reads it, as exact as fp32 and
      memory-bound (torch's int8 kernel is slow with fp32 rows, and takes no group scales);
    - in bf16 with a scale per row, a few rows, compiled or not: torch's int8 kernel (with AMX it
      reads int8 faster than a streamed loop does);
    - otherwise (more rows are compute-bound): dequantize, then GEMM."""
    rows = x.reshape(-1, x.shape[-1])
    policy = machine.POLICY
    on_cpu, few = x.device.type == "cpu", rows.shape[0] <= policy.int8_packed_max_rows
    widens = x.dtype == torch.float32 or scale.dim() == 2
    if on_cpu and not few and round_x and policy.int8_activations and scale.dim() == 1:
        return int8_activations(rows, weight, scale).reshape(*x.shape[:-1], weight.shape[0])
    if on_cpu and widens and not torch.compiler.is_compiling():
        return int8_widened(rows, weight, scale, policy.widen_block_rows).reshape(*x.shape[:-1], weight.shape[0])
    if on_cpu and few and widens:
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
    """The int8 weight widened to rows' dtype `block_rows` rows at a time, each block's product taken
    while it is in cache (faster than dequantizing the whole weight first). A scale per row
    multiplies each block's product; a scale per group, the block's weights."""
    out = torch.empty(rows.shape[0], weight.shape[0], dtype=rows.dtype, device=rows.device)
    for start in range(0, weight.shape[0], block_rows):
        block = slice(start, start + block_rows)
        if scale.dim() == 1:
            torch.mul(F.linear(rows, weight[block].to(rows.dtype)), scale[block], out=out[:, block])
        else:
            out[:, block] = F.linear(rows, widen_int8(weight[block], scale[block], rows.dtype))
    return out


def int8_kernel(rows: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """torch's int8 kernel (one scale per row): reads the weight in one pass."""
    return torch._weight_int8pack_mm(rows.contiguous(), weight, scale)


def int8_activations(rows: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """rows rounded to int8 with a scale per row (symmetric, as the weight), multiplied by the int8
    weight in int8 with int32 sums (`torch._int_mm`: VNNI or AMX-INT8 where the CPU has them), then
    scaled by both: each x moves by at most half its row's step, |x|max / 254."""
    return int8_rounded_product(*rounded_rows(rows), weight, scale, rows.dtype)


def rounded_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """rows [n, K] → int8 codes [n, K] and each row's step [n, 1] (fp32): rows ≈ codes · step."""
    wide = rows.float()
    step = wide.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / INT8_MAX
    return (wide / step).round_().to(torch.int8), step


def int8_rounded_product(codes: Tensor, step: Tensor, weight: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """Rows rounded to int8 (`rounded_rows`) times the int8 weight (a scale per row) → [n, N] in `dtype`."""
    sums = torch._int_mm(codes, weight.t())
    return (sums.float() * step * scale.float()).to(dtype)


def can_prepack_int8() -> bool:
    """Whether this torch has oneDNN's int8 kernel for prepacked weights (its x86 builds)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_prepack")


def prepacked_int8(weight: Tensor) -> Tensor:
    """An int8 weight [N, K] laid out once for oneDNN's int8 kernel: an opaque tensor, read only by
    `int8_prepacked_product`."""
    return torch.ops.onednn.qlinear_prepack(weight, None)


def int8_prepacked(rows: Tensor, prepacked: Tensor, scale: Tensor) -> Tensor:
    """rows rounded to int8 with a scale per row (as `int8_activations`) times a prepacked int8 weight
    (`scale` [N] fp32, one per row) → [n, N] in rows' dtype."""
    return int8_prepacked_product(*rounded_rows(rows), prepacked, scale, rows.dtype)


def int8_prepacked_product(codes: Tensor, step: Tensor, prepacked: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """Rows rounded to int8 (`rounded_rows`) times a prepacked int8 weight → [n, N] in `dtype`: the
    same sums as `int8_rounded_product`, each scaled in fp32."""
    unsigned = (codes.to(torch.int16) + INT8_ZERO).to(torch.uint8)
    return (torch.ops.summarize.int8_prepacked_mm(unsigned, prepacked, scale) * step).to(dtype)


# oneDNN's kernel as an op of our own: inductor lowers `onednn.qlinear_pointwise` only for weights
# frozen into the graph, where a step's weights are its inputs
_ops = torch.library.Library("summarize", "FRAGMENT")
_ops.define("int8_prepacked_mm(Tensor unsigned, Tensor prepacked, Tensor scale) -> Tensor")
_NO_ZEROS = torch.zeros(1, dtype=torch.int32)  # the weight's zero points: symmetric


def _int8_prepacked_mm(unsigned: Tensor, prepacked: Tensor, scale: Tensor) -> Tensor:
    """uint8 codes [n, K] (x's int8 codes + INT8_ZERO) times the prepacked weight, each output
    column times its `scale` → fp32 [n, N]."""
    return torch.ops.onednn.qlinear_pointwise(unsigned, 1.0, INT8_ZERO, prepacked, scale, _NO_ZEROS, None, 1.0, 0,
                                              torch.float32, "none", [], "")


_ops.impl("int8_prepacked_mm", _int8_prepacked_mm, "CompositeExplicitAutograd")


@torch.library.register_fake("summarize::int8_prepacked_mm", lib=_ops)
def _(unsigned: Tensor, prepacked: Tensor, scale: Tensor) -> Tensor:
    return unsigned.new_empty(unsigned.shape[0], scale.shape[0], dtype=torch.float32)


def int8_dequantized(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    return F.linear(x, weight * scale[:, None] if scale.dim() == 1 else widen_int8(weight, scale, x.dtype))


def widen_int8(weight: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """int8 [n, K] times its group scales [n, K/group] → [n, K] in `dtype`, multiplied in fp32."""
    n, K = weight.shape
    return (weight.float().view(n, scale.shape[1], -1) * scale.float()[..., None]).view(n, K).to(dtype)


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
    grouped = scale is not None and scale.dim() == 2
    wide = widen_int8(weight, scale, torch.float32) if grouped else weight.float()
    if has_static_value(rows.shape[0]):
        # one reduction per input row over the same weights: inductor fuses them into one loop
        # that reads (and widens) each weight once, however many rows there are
        out = torch.stack([(wide * row).sum(-1) for row in rows], dim=1)
    else:  # a span of symbolic length (a verify graph): one reduction over [N, rows, K]
        out = (wide[:, None, :] * rows[None]).sum(-1)
    if scale is not None and not grouped:  # int8 with a scale per row
        out = out * scale.float()[:, None]
    return out.t().reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)


def quantize_rows(rows: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """fp32 rows [n, K] → int8 [n, K] and one scale per row [n] in `dtype`, symmetric: the scale
    is rounded to `dtype` first and then used exactly. `rows` is overwritten."""
    absmax = torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg_()).clamp_min(torch.finfo(torch.float32).tiny)  # no |rows| copy
    scale = (absmax / INT8_MAX).to(dtype)
    rows.div_(scale.float()[:, None]).round_().clamp_(-INT8_MAX, INT8_MAX)
    return rows.to(torch.int8), scale


@dataclass(frozen=True)
class Int8Groups:
    """A weight [N, K] as int8 `values` times a scale per group of input channels: a GGUF file's
    Q8_0 (groups of 32) and Q6_K (16) exactly as stored. What a Projection keeps as it is."""

    values: Tensor  # int8 [N, K]
    scale: Tensor  # [N, K/group]: fp16 or fp32, whichever holds the file's scales exactly
    dtype: torch.dtype  # what the projection computes in

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def group(self) -> int:
        return self.values.shape[1] // self.scale.shape[1]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Int8Groups:
        """On `device`, computing in `dtype` (values and scales stay as they are)."""
        return Int8Groups(self.values.to(device=device), self.scale.to(device=device), dtype or self.dtype)

    def dequantized(self, dtype: torch.dtype) -> Tensor:
        return _by_blocks(self.values, dtype, lambda rows: widen_int8(self.values[rows], self.scale[rows], dtype))


@dataclass(frozen=True)
class Int4Groups:
    """A weight [N, K] as 4-bit codes with a scale and an offset per group of input channels, each
    value code · scale + offset: a GGUF file's Q4_0, Q4_1 and Q4_K exactly as stored.

    A Projection keeps it on torch's int4 kernel as (code − 8) · scale + zero, zero = 8 · scale +
    offset, with scale and zero rounded to bf16 (the kernel's; its fp32 variant is a reference
    path): the one rounding of the file's values. It moves each value by at most 31/15 · 2⁻⁸ of its
    group's largest (the zero, the value of code 8, by 2⁻⁸ of it; the scale times |code − 8| ≤ 8 by
    2⁻⁸ of 16/15 of it); on llama-quantize's files, 0.31% (Q4_0), 0.37% (Q4_1) and 0.33% (Q4_K)
    of a tensor's largest value (tests/test_gguf_compact.py)."""

    codes: Tensor  # uint8 [N, K], 0..15
    scale: Tensor  # fp32 [N, K/group]
    offset: Tensor  # fp32 [N, K/group]
    dtype: torch.dtype  # what the projection computes in

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def group(self) -> int:
        return self.codes.shape[1] // self.scale.shape[1]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Int4Groups:
        """On `device`, computing in `dtype` (codes, scales and offsets stay as they are)."""
        return Int4Groups(*(t.to(device=device) for t in (self.codes, self.scale, self.offset)), dtype or self.dtype)

    def dequantized(self, dtype: torch.dtype) -> Tensor:
        """The file's values exactly (in fp32; then rounded to `dtype`)."""
        def rows_of(rows: slice) -> Tensor:
            codes = self.codes[rows]
            n, K = codes.shape
            groups = codes.float().view(n, -1, self.group) * self.scale[rows, :, None] + self.offset[rows, :, None]
            return groups.view(n, K).to(dtype)

        return _by_blocks(self.codes, dtype, rows_of)


def _by_blocks(like: Tensor, dtype: torch.dtype, rows_of) -> Tensor:
    """A tensor shaped as `like` [N, K] in `dtype`, filled `QUANTIZE_BLOCK_ROWS` rows at a time by
    `rows_of(rows)`: bounded fp32 temporaries."""
    out = torch.empty(like.shape, dtype=dtype, device=like.device)
    for start in range(0, like.shape[0], QUANTIZE_BLOCK_ROWS):
        rows = slice(start, start + QUANTIZE_BLOCK_ROWS)
        out[rows] = rows_of(rows)
    return out


def int4_takes(shape: torch.Size, group: int, device: torch.device) -> bool:
    """Whether torch's CPU int4 kernel takes a weight of `shape` [N, K] in groups of `group` on
    `device`: rows a multiple of the block its packing uses on this CPU, input channels of groups."""
    N, K = shape
    block_rows = machine.POLICY.int4_block_rows
    return device.type == "cpu" and block_rows is not None and N % block_rows == 0 and K % group == 0


def packed_int4(codes: Tensor, scale: Tensor, zero: Tensor) -> tuple[Tensor, Tensor]:
    """codes [n, K] (0..15), scale and zero [n, K/group] → torch's int4 packing [n, K/2] uint8 and
    scale_and_zero [K/group, n, 2] bf16, which read as (code − 8) · scale + zero."""
    packed = pack_int4_codes(codes, machine.POLICY.int4_block_rows)
    return packed, torch.stack([scale, zero], -1).transpose(0, 1).bfloat16()


class Projection(nn.Module):
    """A weight [N, K] applied as x @ Wᵀ (and, for an embedding table, looked up by row)."""

    def __init__(self, weight: Tensor | Int8Groups | Int4Groups) -> None:
        super().__init__()
        self.register_buffer("scale", None)  # int8: [N] in the model's dtype, or [N, K/group]
        self.register_buffer("scale_and_zero", None)  # int4: [K/group, N, 2] bf16
        self.group = 0  # int4 and int8 groups: input channels per scale
        self.register_buffer("int4_copy", None)  # a full-precision weight's int4 copy (`add_int4_copy`)
        self.register_buffer("int4_copy_scale_and_zero", None)
        self.int4_copy_group = 0
        self.register_buffer("int8_prepacked", None)  # an int8 weight prepacked for oneDNN (`prepack_int8`)
        self.register_buffer("int8_prepacked_scale", None)  # its scale per row, fp32 [N]
        # what it computes in, kept by name: a dtype held by a module is the one object every
        # tensor of that dtype names, and torch's saved graphs (`compiled_store`) lose it then
        self.dtype_name = str(weight.dtype).removeprefix("torch.")
        if isinstance(weight, Int4Groups) and not int4_takes(weight.shape, weight.group, weight.codes.device):
            weight = weight.dequantized(weight.dtype)  # a shape or device torch's int4 kernel cannot take
        if isinstance(weight, Int4Groups):
            self.register_buffer("weight", torch.empty(weight.shape[0], weight.shape[1] // 2, dtype=torch.uint8))
            self.scale_and_zero = torch.empty(weight.scale.shape[1], weight.shape[0], 2, dtype=torch.bfloat16)
            for start in range(0, weight.shape[0], QUANTIZE_BLOCK_ROWS):  # a multiple of the block: packed blocks stay whole
                rows = slice(start, start + QUANTIZE_BLOCK_ROWS)
                scale = weight.scale[rows]
                self.weight[rows], self.scale_and_zero[:, rows] = packed_int4(weight.codes[rows], scale, 8 * scale + weight.offset[rows])
            self.group = weight.group
        elif isinstance(weight, Int8Groups):
            self.register_buffer("weight", weight.values)
            self.scale, self.group = weight.scale, weight.group
        else:
            self.register_buffer("weight", weight)  # [N, K]; int8 [N, K]; int4 packed [N, K/2] uint8

    @classmethod
    def concat(cls, parts: Sequence[Tensor | Int8Groups | Int4Groups]) -> Projection | StackedProjections:
        """One projection of `parts` stacked by rows where they share a form (int8 groups of two
        sizes on the smaller, each scale repeated); where their forms differ (a mix cannot share
        one kernel), the parts apart, their outputs stacked."""
        dtype = parts[0].dtype
        if all(isinstance(p, Tensor) for p in parts):
            return cls(torch.cat(list(parts)))
        if all(isinstance(p, Int4Groups) for p in parts) and len({p.group for p in parts}) == 1:
            return cls(Int4Groups(*(torch.cat(t) for t in zip(*((p.codes, p.scale, p.offset) for p in parts))), dtype))
        if all(isinstance(p, Int8Groups) for p in parts):
            group = min(p.group for p in parts)
            scale_dtype = functools.reduce(torch.promote_types, (p.scale.dtype for p in parts))
            scales = [p.scale.to(scale_dtype).repeat_interleave(p.group // group, dim=1) for p in parts]
            return cls(Int8Groups(torch.cat([p.values for p in parts]), torch.cat(scales), dtype))
        return StackedProjections([cls(part) for part in parts])

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype_name)

    @property
    def shape(self) -> tuple[int, int]:
        """The weight's [N, K], whatever form holds it."""
        if self.int8_prepacked is not None:
            K, N = self.int8_prepacked.shape
            return N, K
        N, K = self.weight.shape
        return (N, K * 2) if self.scale_and_zero is not None else (N, K)

    def forward(self, x: Tensor) -> Tensor:
        # generating: one form for the batch, whatever the rows of this product (a step, a span)
        past_copy = _generating > machine.POLICY.int4_copy_max_batch
        if _generating and self.int4_copy is not None and not past_copy:
            return linear_int4(x, self.int4_copy, self.int4_copy_scale_and_zero, self.int4_copy_group)
        if self.int8_prepacked is not None:  # whatever the rows: x rounded to int8
            rows = x.reshape(-1, x.shape[-1])
            return int8_prepacked(rows, self.int8_prepacked, self.int8_prepacked_scale).reshape(*x.shape[:-1], -1)
        auto_int8 = self.scale is not None and self.scale.dim() == 1  # as auto stores: a scale per row
        if _generating and auto_int8 and machine.POLICY.int4_copy_generates:
            if past_copy and machine.POLICY.int8_activations and x.device.type == "cpu":  # as auto reads: x rounded too
                rows = x.reshape(-1, x.shape[-1])
                return int8_activations(rows, self.weight, self.scale).reshape(*x.shape[:-1], self.weight.shape[0])
            return linear_int8(x, self.weight, self.scale, round_x=False)
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
        if self.scale.dim() == 2:  # int8 groups
            flat = ids.reshape(-1)
            return widen_int8(self.weight[flat], self.scale[flat], self.dtype).view(*ids.shape, -1)
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
        (`int4_packed`).

        Returns False, and keeps the weight as it is, where torch's CPU kernel cannot take its
        shape (rows not a multiple of its block, or input channels not a multiple of `group`) or
        device.
        """
        if self.scale is not None or self.scale_and_zero is not None:
            return self.scale_and_zero is not None
        if not int4_takes(self.weight.shape, group, self.weight.device):
            return False
        self.weight, self.scale_and_zero = int4_packed(self.weight, group)
        self.group = group
        return True

    def prepack_int8(self, keep_rows: bool) -> bool:
        """Hold an int8 weight (a scale per row) prepacked for oneDNN's int8 kernel, read with x
        rounded to int8 (`int8_prepacked`); the plain weight stays only with `keep_rows` (a table
        also read by row: a prepacked weight has no rows). False where there is none: another
        form, or no such kernel here."""
        if self.scale is None or self.scale.dim() != 1 or self.weight.device.type != "cpu" or not can_prepack_int8():
            return False
        self.int8_prepacked, self.int8_prepacked_scale = prepacked_int8(self.weight), self.scale.float()
        if not keep_rows:
            self.weight = None
        return True

    def add_int4_copy(self, group: int = INT4_GROUP) -> bool:
        """Keep an int4 copy of a full-precision weight beside it (`int4_packed`), read inside
        `generating_tokens`. False where there is none: a quantized weight, or a shape or device
        torch's int4 kernel cannot take."""
        if self.scale is not None or self.scale_and_zero is not None or not int4_takes(self.weight.shape, group, self.weight.device):
            return False
        self.int4_copy, self.int4_copy_scale_and_zero = int4_packed(self.weight, group)
        self.int4_copy_group = group
        return True


def int4_packed(weight: Tensor, group: int) -> tuple[Tensor, Tensor]:
    """weight [N, K] → torch's int4 packing [N, K/2] uint8 and scale_and_zero [K/group, N, 2] bf16:
    asymmetric, round to nearest, each group's minimum and maximum exact up to bf16. Works through
    the rows in blocks, so the fp32 temporaries stay small (the 248K-row head would otherwise need
    a gigabyte of them)."""
    N, K = weight.shape
    packed = torch.empty(N, K // 2, dtype=torch.uint8)
    scale_and_zero = torch.empty(K // group, N, 2, dtype=torch.bfloat16)
    for start in range(0, N, QUANTIZE_BLOCK_ROWS):  # a multiple of the block: packed blocks stay whole
        rows = slice(start, start + QUANTIZE_BLOCK_ROWS)
        block = weight[rows].to(torch.float32, copy=True).view(-1, K // group, group)  # overwritten in place below
        low, high = block.amin(dim=-1), block.amax(dim=-1)  # faster than torch.aminmax over a group (performance.md)
        scale = ((high - low) / INT4_LEVELS).clamp_min(torch.finfo(torch.float32).tiny).bfloat16().float()
        zero = (low + 8 * scale).bfloat16().float()  # code 0 reads as the group's minimum
        codes = block.sub_(zero[..., None]).div_(scale[..., None]).add_(8).round_().clamp_(0, INT4_LEVELS)
        packed[rows], scale_and_zero[:, rows] = packed_int4(codes.view(-1, K), scale, zero)
    return packed, scale_and_zero


class StackedProjections(nn.Module):
    """Projections of different forms applied to the same x, their outputs stacked: what
    `Projection.concat` gives where its parts cannot share one matrix."""

    def __init__(self, parts: Sequence[Projection]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


QUANTIZATIONS = ("int8", "int4")  # what `Projection.quantize` takes


def quantized(module: nn.Module, mode: str | None) -> nn.Module:
    """`module` with every `Projection` in it quantized to `mode` (None: as it is). Called on each
    part of a model as it is built, so the full-precision weights never exist all at once."""
    if mode is not None:
        for part in module.modules():
            if isinstance(part, Projection):
                part.quantize(mode)
    return module

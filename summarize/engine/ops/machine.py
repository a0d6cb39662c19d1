"""The machine policy: which kernel each CPU dispatch takes on this CPU, in one record.

`POLICY` starts as the portable default, the same on every CPU but for two facts torch reports
about it (whether it multiplies bf16 in hardware, the block of its int4 packing); at a model's load
the calibration (`ops/calibration.py`) replaces the fields it timed on the machine.
The ops and the loader read its fields and never test the CPU themselves; a test installs another
record in its place. Each field, what it decides and the measurements behind it:
docs/kernel-policy.md.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

import torch

from summarize.engine.ops.int4_packing import packing_block_rows

X86 = ("x86_64", "amd64", "x86", "i386", "i686")  # platform.machine() of an x86 CPU
EVERY_BATCH = 1 << 16  # more sequences than any batch the engine generates


@dataclass(frozen=True)
class CpuPolicy:
    """What each dispatch on this CPU takes (row counts are a product's input rows)."""

    dtype: torch.dtype  # what a model loads in on the CPU when none is asked for
    # fp32 products of this many rows ask torch's GEMM for W @ xᵀ, the weight first; others x @ Wᵀ
    weight_first_min_rows: int
    weight_first_max_rows: int
    streamed_fp32_max_rows: int  # a compiled fp32 step of up to this many rows streams the weights itself (0: never)
    int8_packed_max_rows: int  # up to this many rows an int8 product reads its weight in one pass
    widen_block_rows: int  # int8 rows widened to fp32 at a time by an eager fp32 product: a block that stays in cache
    # 1: a product of more rows than `int8_packed_max_rows` by an int8 weight (a scale per row)
    # rounds x to int8 too, a scale per row, and multiplies in int8 (`linear.int8_activations`); and
    # quantize="auto" stores a full-precision model's weights so. 0: it widens or dequantizes the weight
    int8_activations: int
    # 1: those int8 weights (where `int8_activations` stores them) that have an int4 copy are held
    # prepacked for oneDNN's int8 kernel (`Projection.prepack_int8`), every product then rounding x;
    # 0: plain, for `_int_mm`
    int8_prepacked: int
    int4_kernel_max_rows: int  # up to this many rows torch's int4 kernel; more: dequantize, then GEMM
    int4_block_rows: int | None  # rows per block of torch's int4 packing here (None: no int4)
    # 1: a full-precision model loaded with quantize="auto" keeps an int4 copy of its weights for
    # the steps that generate tokens (`Projection.add_int4_copy`); 0: it keeps its weights alone
    int4_copy_generates: int
    # generating batches of up to this many sequences read the int4 copy; a larger batch reads the
    # weights as a prompt's are read (x rounded to int8 where `auto` stored them as int8)
    int4_copy_max_batch: int
    chunk_token_heads: int  # token × head rows per block of the chunked recurrences


def policy_for(multiplies_bf16: bool, int4_block_rows: int | None) -> CpuPolicy:
    """The portable default policy of a CPU, given its bf16 and int4 facts: the same on every CPU,
    where the calibration has not timed the machine (`SUMMARIZE_CALIBRATE=0`, or out of time)."""
    return CpuPolicy(
        dtype=torch.bfloat16 if multiplies_bf16 else torch.float32,
        weight_first_min_rows=4,
        weight_first_max_rows=32,
        streamed_fp32_max_rows=0,
        int8_packed_max_rows=16,
        widen_block_rows=512,
        int8_activations=0,
        int8_prepacked=0,
        int4_kernel_max_rows=64,
        int4_block_rows=int4_block_rows,
        int4_copy_generates=0,
        int4_copy_max_batch=EVERY_BATCH,
        chunk_token_heads=2048,
    )


def this_cpu() -> CpuPolicy:
    """The policy of the CPU this process runs on, from what torch reports about it."""
    return policy_for(cpu_multiplies_bf16(), packing_block_rows())


def cpu_multiplies_bf16() -> bool:
    """Whether this CPU has bf16 multiply instructions: AVX512-BF16 or AMX on x86, BF16 on ARM.

    oneDNN's own check (`_is_mkldnn_bf16_supported`) also says yes on x86 cores with plain AVX-512,
    where it widens every bf16 value to fp32 in software, slower than fp32 itself.
    """
    if not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    if platform.machine().lower() in X86:
        return _cpu_reports("avx512_bf16") or _cpu_reports("amx_tile")
    return True


def _cpu_reports(feature: str) -> bool:
    """torch's own CPU feature check (`torch.cpu._is_<feature>_supported`); False where this torch lacks it."""
    check = getattr(torch.cpu, f"_is_{feature}_supported", None)
    return bool(check is not None and check())


# Read as `machine.POLICY` (not imported by name), so that one replaced here is the one every dispatch reads
POLICY = this_cpu()

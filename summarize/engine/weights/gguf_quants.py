"""GGML's tensor types: the size of each one's blocks, and their values in torch.

A quantized tensor is stored row by row, each row a run of blocks; a block packs `elements` values
into `nbytes` bytes with its own scale (and minimum, for the `_1` and K kinds). `dequantize` turns
blocks [n, nbytes] (uint8) into their values [n, elements] (fp32), in torch, exactly as ggml's
reference code and gguf-py do (tests/test_gguf_quants.py compares them block for block).

The IQ kinds (lattice codebooks), the ternary TQ kinds and NVFP4 are decoded by gguf-py's numpy
code when it is installed (`pip install 'summarize[gguf]'`); they are rare in the files people run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from summarize.errors import SummarizeError

QK_K = 256  # elements in a K-quant super-block


@dataclass(frozen=True)
class GGMLType:
    name: str
    type_id: int
    elements: int  # values in one block (1 for plain floats)
    nbytes: int  # bytes of one block
    float_dtype: torch.dtype | None = None  # plain floats: the torch dtype the bytes are


_TYPES = [
    GGMLType("F32", 0, 1, 4, torch.float32),
    GGMLType("F16", 1, 1, 2, torch.float16),
    GGMLType("Q4_0", 2, 32, 18),
    GGMLType("Q4_1", 3, 32, 20),
    GGMLType("Q5_0", 6, 32, 22),
    GGMLType("Q5_1", 7, 32, 24),
    GGMLType("Q8_0", 8, 32, 34),
    GGMLType("Q8_1", 9, 32, 40),
    GGMLType("Q2_K", 10, QK_K, 84),
    GGMLType("Q3_K", 11, QK_K, 110),
    GGMLType("Q4_K", 12, QK_K, 144),
    GGMLType("Q5_K", 13, QK_K, 176),
    GGMLType("Q6_K", 14, QK_K, 210),
    GGMLType("Q8_K", 15, QK_K, 292),
    GGMLType("IQ2_XXS", 16, QK_K, 66),
    GGMLType("IQ2_XS", 17, QK_K, 74),
    GGMLType("IQ3_XXS", 18, QK_K, 98),
    GGMLType("IQ1_S", 19, QK_K, 50),
    GGMLType("IQ4_NL", 20, 32, 18),
    GGMLType("IQ3_S", 21, QK_K, 110),
    GGMLType("IQ2_S", 22, QK_K, 82),
    GGMLType("IQ4_XS", 23, QK_K, 136),
    GGMLType("I8", 24, 1, 1),
    GGMLType("I16", 25, 1, 2),
    GGMLType("I32", 26, 1, 4),
    GGMLType("I64", 27, 1, 8),
    GGMLType("F64", 28, 1, 8, torch.float64),
    GGMLType("IQ1_M", 29, QK_K, 56),
    GGMLType("BF16", 30, 1, 2, torch.bfloat16),
    GGMLType("TQ1_0", 34, QK_K, 54),
    GGMLType("TQ2_0", 35, QK_K, 66),
    GGMLType("MXFP4", 39, 32, 17),
    GGMLType("NVFP4", 40, 64, 36),
    GGMLType("Q1_0", 41, 128, 18),
]
GGML_TYPES: dict[int, GGMLType] = {t.type_id: t for t in _TYPES}

# Decoded by gguf-py when it is installed (lattice codebooks we do not copy here)
GGUF_PY_KINDS = frozenset({"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ3_S", "IQ2_S", "IQ1_M", "TQ1_0", "TQ2_0",
                           "NVFP4"})

IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # e2m1, doubled


def dequantize(kind: GGMLType, blocks: Tensor) -> Tensor:
    """blocks uint8 [n, kind.nbytes] → values fp32 [n, kind.elements]."""
    decode = _DECODERS.get(kind.name)
    if decode is not None:
        return decode(blocks)
    if kind.name in GGUF_PY_KINDS:
        return _with_gguf_py(kind, blocks)
    raise SummarizeError(f"GGML type {kind.name} holds no weights summarize can read")


def can_dequantize(kind: GGMLType) -> bool:
    return kind.name in _DECODERS or kind.name in GGUF_PY_KINDS


# -- pieces of a block ------------------------------------------------------------------------------


def _f16(blocks: Tensor, at: int) -> Tensor:
    """The fp16 scalar at byte `at` of each block → fp32 [n, 1]."""
    return blocks[:, at : at + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: Tensor) -> Tensor:
    """Bytes [..., m] → their low nibbles then their high nibbles [..., 2m] (uint8)."""
    return torch.cat([packed & 0x0F, packed >> 4], dim=-1)


def _bits(packed: Tensor, count: int) -> Tensor:
    """Little-endian bit i of the bytes [n, count/8] → [n, count] (uint8 0/1)."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((packed[:, :, None] >> shifts) & 1).reshape(packed.shape[0], count)


def _lookup(table: tuple[int, ...], index: Tensor) -> Tensor:
    return torch.tensor(table, dtype=torch.float32)[index.long()]


# -- the 32-element kinds ---------------------------------------------------------------------------


def _q4_0(blocks: Tensor) -> Tensor:
    d = _f16(blocks, 0)
    return d * (_nibbles(blocks[:, 2:18]).to(torch.int8) - 8).float()


def _q4_1(blocks: Tensor) -> Tensor:
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    return d * _nibbles(blocks[:, 4:20]).float() + m


def _q5_0(blocks: Tensor) -> Tensor:
    d = _f16(blocks, 0)
    q = _nibbles(blocks[:, 6:22]) | (_bits(blocks[:, 2:6], 32) << 4)
    return d * (q.to(torch.int8) - 16).float()


def _q5_1(blocks: Tensor) -> Tensor:
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    q = _nibbles(blocks[:, 8:24]) | (_bits(blocks[:, 4:8], 32) << 4)
    return d * q.float() + m


def _q8_0(blocks: Tensor) -> Tensor:
    return blocks[:, 2:34].contiguous().view(torch.int8).float() * _f16(blocks, 0)


def _iq4_nl(blocks: Tensor) -> Tensor:
    return _f16(blocks, 0) * _lookup(IQ4_NL_VALUES, _nibbles(blocks[:, 2:18]))


def _mxfp4(blocks: Tensor) -> Tensor:
    e = blocks[:, :1].to(torch.int32)
    # ggml_e8m0_to_fp32_half: 2^(e - 128) as fp32 bits, subnormal for e < 2
    subnormal = torch.bitwise_left_shift(torch.tensor(0x00200000, dtype=torch.int32), e)
    bits = torch.where(e < 2, subnormal, (e - 1) << 23)
    return bits.view(torch.float32) * _lookup(MXFP4_VALUES, _nibbles(blocks[:, 1:17]))


# -- the K kinds: super-blocks of 256 in sub-blocks of 16 or 32 -------------------------------------


def _q2_k(blocks: Tensor) -> Tensor:
    n = blocks.shape[0]
    scales, qs = blocks[:, :16], blocks[:, 16:80]
    d, dmin = _f16(blocks, 80), _f16(blocks, 82)
    dl = (d * (scales & 0x0F).float()).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).reshape(n, 16, 1)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
    q = ((qs.reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 16, 16).float()
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k(blocks: Tensor) -> Tensor:
    n = blocks.shape[0]
    hmask, qs, packed, d = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108], _f16(blocks, 108)
    low = (packed[:, :8].reshape(n, 1, 8) >> torch.tensor([0, 4], dtype=torch.uint8).reshape(1, 2, 1)).reshape(n, 16)
    high = (packed[:, 8:12].reshape(n, 1, 4) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 4, 1)).reshape(n, 16)
    scales = (((low & 0x0F) | ((high & 0x03) << 4)).to(torch.int8) - 32).float()
    dl = (d * scales).reshape(n, 16, 1)
    ql = (qs.reshape(n, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)).reshape(n, 16, 16) & 3
    qh = (hmask.reshape(n, 1, 1, 32) >> torch.arange(8, dtype=torch.uint8).reshape(1, 1, 8, 1)).reshape(n, 16, 16) & 1
    q = (ql.to(torch.int8) - ((qh ^ 1) << 2).to(torch.int8)).float()  # the high bit set means no offset
    return (dl * q).reshape(n, QK_K)


def _k_scales(packed: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K's and Q5_K's 12 bytes → 8 six-bit scales and 8 six-bit minima per super-block."""
    n = packed.shape[0]
    d, m, m_d = packed.reshape(n, 3, 4).unbind(1)
    scales = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    minima = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return scales.float(), minima.float()


def _q4_k_parts(blocks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Q4_K blocks → codes uint8 [n, 8, 32], each sub-block's scale d·sc and minimum dmin·m [n, 8, 1] (fp32, exact)."""
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    scales, minima = _k_scales(blocks[:, 4:16])
    dl, ml = (d * scales).reshape(n, 8, 1), (dmin * minima).reshape(n, 8, 1)
    return _nibbles(blocks[:, 16:144].reshape(n, 4, 32)).reshape(n, 8, 32), dl, ml


def _q4_k(blocks: Tensor) -> Tensor:
    q, dl, ml = _q4_k_parts(blocks)
    return (dl * q.float() - ml).reshape(-1, QK_K)


def _q5_k(blocks: Tensor) -> Tensor:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    scales, minima = _k_scales(blocks[:, 4:16])
    dl, ml = (d * scales).reshape(n, 8, 1), (dmin * minima).reshape(n, 8, 1)
    qh = (blocks[:, 16:48].reshape(n, 1, 32) >> torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)) & 1  # [n, 8, 32]
    ql = _nibbles(blocks[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32)
    return (dl * (ql | (qh << 4)).float() - ml).reshape(n, QK_K)


def _q6_k_parts(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """Q6_K blocks → values q − 32 int8 [n, 16, 16] and each sub-block's scale d·sc [n, 16, 1] (fp32, exact)."""
    n = blocks.shape[0]
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(blocks, 208) * scales).reshape(n, 16, 1)
    low = _nibbles(ql.reshape(n, 2, 64)).reshape(n, 8, 32)  # [half, nibble, 32-byte run]
    high = ((qh.reshape(n, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)) & 3).reshape(n, 8, 32)
    return ((low | (high << 4)).to(torch.int8) - 32).reshape(n, 16, 16), d


def _q6_k(blocks: Tensor) -> Tensor:
    q, d = _q6_k_parts(blocks)
    return (d * q.float()).reshape(-1, QK_K)


def _iq4_xs(blocks: Tensor) -> Tensor:
    n = blocks.shape[0]
    d = _f16(blocks, 0)
    scales_h = blocks[:, 2:4].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF  # [n, 1]
    scales_l = _interleaved_nibbles(blocks[:, 4:8])  # [n, 8]
    scales_h = (scales_h >> torch.arange(0, 16, 2, dtype=torch.int32)) & 0x03
    scales = ((scales_l.to(torch.int32) | (scales_h << 4)) - 32).float()
    dl = (d * scales).reshape(n, 8, 1)
    q = _nibbles(blocks[:, 8:136].reshape(n, 8, 16))  # [n, 8, 32]
    return (dl * _lookup(IQ4_NL_VALUES, q)).reshape(n, QK_K)


def _interleaved_nibbles(packed: Tensor) -> Tensor:
    """Bytes [n, m] → low, high nibble of byte 0, then of byte 1, ... [n, 2m]."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


_DECODERS = {
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs, "MXFP4": _mxfp4,
}


# -- the kinds kept compact: their codes and group scales as stored (ops.linear's Int4Groups, Int8Groups)

INT4_KINDS = frozenset({"Q4_0", "Q4_1", "Q4_K"})  # 4-bit codes, a scale and an offset per 32 values
INT4_GROUP = 32  # values per scale and offset (a K super-block's sub-block)
# int8 values with a scale per group: Q8_0's own, Q6_K's q − 32, Q4_0's codes − 8 (its offset is −8·scale)
INT8_GROUPS = {"Q8_0": 32, "Q6_K": 16, "Q4_0": 32}


def int4_groups(kind: GGMLType, blocks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Q4_0, Q4_1 or Q4_K blocks [n, nbytes] → codes uint8 [n, elements] (0..15) and a scale and an
    offset per 32 values, fp32 [n, elements/32]: each value is code · scale + offset, for finite
    scales `dequantize`'s value bit for bit."""
    if kind.name == "Q4_K":
        q, dl, ml = _q4_k_parts(blocks)
        return q.reshape(-1, QK_K), dl.reshape(-1, 8), -ml.reshape(-1, 8)
    d = _f16(blocks, 0)
    if kind.name == "Q4_0":
        return _nibbles(blocks[:, 2:18]), d, -8 * d
    return _nibbles(blocks[:, 4:20]), d, _f16(blocks, 2)  # Q4_1


def int8_groups(kind: GGMLType, blocks: Tensor) -> tuple[Tensor, Tensor]:
    """Q8_0, Q6_K or Q4_0 blocks [n, nbytes] → values int8 [n, elements] and a scale per group of
    `INT8_GROUPS[kind]` values [n, elements/group]: the file's fp16 scales (Q8_0, Q4_0), or Q6_K's
    d·sc in fp32 (exact). Each value is values · scale, for finite scales `dequantize`'s bit for bit."""
    if kind.name == "Q6_K":
        q, d = _q6_k_parts(blocks)
        return q.reshape(-1, QK_K), d.reshape(-1, 16)
    d = blocks[:, :2].contiguous().view(torch.float16)  # [n, 1]
    if kind.name == "Q8_0":
        return blocks[:, 2:34].contiguous().view(torch.int8), d
    return _nibbles(blocks[:, 2:18]).to(torch.int8) - 8, d  # Q4_0


def _with_gguf_py(kind: GGMLType, blocks: Tensor) -> Tensor:
    """Blocks of a kind we do not decode ourselves, through gguf-py's numpy code (if installed)."""
    try:
        import numpy as np
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize as numpy_dequantize
    except ImportError:
        raise SummarizeError(f"{kind.name} weights need the gguf package: pip install 'summarize[gguf]'") from None
    from summarize.engine.weights.safetensors_file import bytes_of

    packed = np.frombuffer(bytes_of(blocks.contiguous()), dtype=np.uint8).reshape(blocks.shape)
    with np.errstate(all="ignore"):  # a NaN or infinite scale decodes to NaNs, as in our own decoders
        values = numpy_dequantize(packed, GGMLQuantizationType(kind.type_id)).astype(np.float32)
    return torch.frombuffer(bytearray(values.tobytes()), dtype=torch.float32).reshape(blocks.shape[0], kind.elements)

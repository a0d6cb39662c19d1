"""The safetensors file layout, written and read by the engine itself (no numpy): an 8-byte
little-endian header length, a JSON header of name -> dtype, shape, data_offsets, then the bytes.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import torch

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
# safetensors' own limit on a header (its JSON): a longer one is a corrupt or hostile file
MAX_HEADER_BYTES = 100_000_000
HEADER_LENGTH_BYTES = 8  # a file opens with its header's length, little-endian u64
HEADER_ALIGN = 8  # the header is padded with spaces so the data starts aligned


def write(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` (any device; dtypes of SAFETENSORS_DTYPES) as a safetensors file."""
    data = {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()}
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, tensor in data.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % HEADER_ALIGN)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(HEADER_LENGTH_BYTES, "little"))
        f.write(blob)
        for tensor in data.values():
            f.write(bytes_of(tensor))


def bytes_of(tensor: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's memory as bytes to read or write, without a copy and without numpy
    (bytes(storage) would go element by element)."""
    size = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_char * size).from_address(tensor.data_ptr())) if size else memoryview(b"")

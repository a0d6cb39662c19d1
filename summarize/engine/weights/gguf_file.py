"""GGUF files (llama.cpp, ollama, LM Studio): the header parsed, then the tensors read one at a time.

The layout (little-endian): "GGUF", a version (2 or 3), the tensor and key-value counts, the
key-value metadata (typed scalars, strings and arrays), one entry per tensor (name, dimensions in
ggml's order, innermost first, GGML type, offset), then the tensor data from the next multiple of
`general.alignment`.

The header is parsed here in plain Python over a memory map of the file. gguf-py's GGUFReader
turns every metadata string into numpy objects, and a Qwen3.5 file holds 750K of them (vocabulary
and merges), which makes opening one slow and large (docs/performance.md). Here string arrays are only walked when the file
is opened, and decoded when the tokenizer asks for them. No numpy.

Tensors are read with plain file reads a bounded run of rows at a time (not through the map, whose
pages would stay resident beside the converted weights) and converted straight to what the model
keeps: the model's dtype, or for Q8_0 the engine's int8 rows (`read(..., int8=True)`).
`in_memory_kind` is the one place that decides which.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from summarize.engine.memory import release_free_memory
from summarize.engine.ops.linear import Int8Rows, quantize_rows
from summarize.engine.weights.gguf_quants import GGML_TYPES, GGMLType, can_dequantize, dequantize
from summarize.engine.weights.safetensors_file import bytes_of
from summarize.errors import SummarizeError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
READ_CHUNK_BYTES = 4 << 20  # a tensor is read and converted this many fp32 bytes at a time: bounded temporaries
SUFFIX = ".gguf"

# Metadata value types: scalars by struct format, then string and array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class StringList:
    """An array of strings in the header, decoded only when asked for (`GGUFFile.strings`)."""

    start: int  # byte where its first string's length is
    end: int
    count: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # PyTorch's order, outermost first: ggml's dimensions reversed
    kind: GGMLType | None  # None: a type id this version does not know
    type_id: int
    offset: int  # where its bytes start in the file
    nbytes: int


def in_memory_kind(kind: GGMLType, int8: bool) -> str:
    """What a tensor of `kind` becomes: "int8" (per-row int8, where the model takes it: `int8`) or
    "dense" (the model's dtype). Q8_0 keeps its 8 bits; every other quantized kind is widened.
    When the engine gains a 4-bit kernel, Q4_0/Q4_K map onto it here."""
    return "int8" if int8 and kind.name == "Q8_0" else "dense"


class GGUFFile:
    """A GGUF file's metadata (`metadata`, `get`, `strings`) and tensors (`tensors`, `read`).

    Everything about the file is checked when it is opened (magic, version, every size and offset
    against the file's length), so a truncated or corrupt file is a one-line SummarizeError naming
    it before anything is allocated.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < len(MAGIC) + 4 + 16:
                    raise SummarizeError(f"{self.path}: not a GGUF file ({size} bytes)")
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
                    header = _Header(buffer, size, self.path)
                    self.metadata, self.tensors, self.data_start = header.parse()
        except OSError as exc:
            raise SummarizeError(f"{self.path}: cannot be read ({exc.strerror or exc})") from None
        self.architecture = self.get("general.architecture", str)
        self.widened: dict[str, int] = {}  # quantized kinds read into the model's dtype: tensors of each
        self.widened_to: torch.dtype | None = None

    # -- metadata -----------------------------------------------------------------------------------

    def get(self, key: str, kind: type | tuple[type, ...], default=...):
        """The value of `key`, which must be of `kind` (int accepts any integer type; float an int too).
        Missing: `default`, or a one-line error if none is given."""
        if key not in self.metadata:
            if default is ...:
                raise SummarizeError(f"{self.path}: no metadata {key}")
            return default
        value = self.metadata[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and type(value) is int:
            value = float(value)
        if type(value) not in kinds:
            names = " or ".join(k.__name__ for k in kinds)
            raise SummarizeError(f"{self.path}: metadata {key} should be {names}, not {type(value).__name__} {value!r:.40}")
        return value

    def strings(self, key: str) -> list[str]:
        """An array of strings (a vocabulary, merges), decoded now."""
        found = self.get(key, StringList)
        with open(self.path, "rb") as f:
            f.seek(found.start)
            data = f.read(found.end - found.start)
        out, pos = [], 0
        for _ in range(found.count):
            (length,) = struct.unpack_from("<Q", data, pos)
            try:
                out.append(data[pos + 8 : pos + 8 + length].decode("utf-8"))
            except UnicodeDecodeError:
                raise SummarizeError(f"{self.path}: metadata {key} holds a string that is not UTF-8") from None
            pos += 8 + length
        return out

    # -- tensors ------------------------------------------------------------------------------------

    def read(self, name: str, *, dtype: torch.dtype, int8: bool = False) -> Tensor | Int8Rows:
        """The tensor `name` in PyTorch's shape, converted to `dtype`; with `int8`, a Q8_0 matrix as
        per-row `Int8Rows` instead (see `in_memory_kind`). Read a bounded run of rows at a time."""
        info = self.tensors.get(name)
        if info is None:
            raise SummarizeError(f"{self.path}: no tensor {name}")
        kind = info.kind
        if kind is None:
            raise SummarizeError(f"{self.path}: tensor {name} is of GGML type {info.type_id}, which this version does not know")
        if kind.float_dtype is None and not can_dequantize(kind):
            raise SummarizeError(f"{self.path}: tensor {name} is {kind.name}, which holds no weights summarize can read")
        rows, width = math.prod(info.shape[:-1]), info.shape[-1]
        row_bytes = width // kind.elements * kind.nbytes
        step = max(1, READ_CHUNK_BYTES // (width * 4))
        as_int8 = in_memory_kind(kind, int8) == "int8" and len(info.shape) == 2
        out = torch.empty(rows, width, dtype=torch.int8 if as_int8 else dtype)
        scale = torch.empty(rows, dtype=dtype) if as_int8 else None
        raw = None
        with open(self.path, "rb") as f:
            f.seek(info.offset)
            for start in range(0, rows, step):
                n = min(step, rows - start)
                if kind.float_dtype == dtype and not as_int8:  # stored as the model keeps it: read in place
                    self._read_into(f, out[start : start + n], name)
                    continue
                if raw is None:
                    raw = torch.empty(min(step, rows) * row_bytes, dtype=torch.uint8)
                chunk = raw[: n * row_bytes]
                self._read_into(f, chunk, name)
                if kind.float_dtype is not None:
                    values = chunk.view(kind.float_dtype).view(n, width)
                else:
                    values = dequantize(kind, chunk.view(-1, kind.nbytes)).view(n, width)
                if as_int8:
                    out[start : start + n], scale[start : start + n] = quantize_rows(values, dtype)
                else:
                    out[start : start + n] = values
        if raw is not None and info.nbytes > READ_CHUNK_BYTES:
            # the runs' freed temporaries, which glibc would keep in its heaps (fragmented by the
            # tensors kept between them): without this, loading peaks ~8% above the weights it keeps
            release_free_memory()
        if as_int8:
            return Int8Rows(out, scale)
        if kind.float_dtype is None:
            self.widened[kind.name] = self.widened.get(kind.name, 0) + 1
            self.widened_to = dtype
        return out.view(info.shape)

    def widening_note(self) -> str | None:
        """One line naming the quantized kinds that were read into the model's dtype, if any."""
        if not self.widened:
            return None
        kinds = ", ".join(f"{kind} ({count} tensor{'s' * (count > 1)})" for kind, count in sorted(self.widened.items()))
        dtype = str(self.widened_to).removeprefix("torch.")
        return f"{self.path.name}: {kinds} widened to {dtype}: no kernel here keeps them compact"

    def _read_into(self, f, tensor: Tensor, name: str) -> None:
        view = bytes_of(tensor)
        if f.readinto(view) != len(view):
            raise SummarizeError(f"{self.path}: truncated; tensor {name} is incomplete")


@functools.lru_cache(maxsize=64)
def _layout(fmt: str) -> struct.Struct:
    return struct.Struct("<" + fmt)


class _Header:
    """A cursor over the header's bytes; every read is checked against the file's length."""

    def __init__(self, buffer, size: int, path: Path) -> None:
        self.buffer, self.size, self.path, self.pos = buffer, size, path, 0

    def parse(self) -> tuple[dict, dict[str, TensorInfo], int]:
        magic = bytes(self.buffer[:4])
        if magic != MAGIC:
            raise SummarizeError(f"{self.path}: not a GGUF file (it starts with {magic!r}, not {MAGIC!r})")
        self.pos = 4
        (version,) = self.unpack("I")
        if version not in VERSIONS:
            raise SummarizeError(f"{self.path}: GGUF version {version} is not supported (only {VERSIONS[0]} and {VERSIONS[1]}; "
                                 "a big-endian file reads as a huge version)")
        tensor_count, kv_count = self.unpack("QQ")
        # each entry takes at least 8 (+ 4) bytes: a count beyond that is a corrupt header
        if tensor_count > self.size // 8 or kv_count > self.size // 12:
            raise SummarizeError(f"{self.path}: not a GGUF file (it claims {tensor_count:,} tensors and {kv_count:,} metadata "
                                 f"entries in {self.size:,} bytes)")
        metadata = {}
        for _ in range(kv_count):
            key = self.string("a metadata key")
            (value_type,) = self.unpack("I")
            metadata[key] = self.value(value_type, key)
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise SummarizeError(f"{self.path}: general.alignment must be a power of two, not {alignment!r}")
        entries = [self.tensor_entry() for _ in range(tensor_count)]
        data_start = -(-self.pos // alignment) * alignment
        tensors: dict[str, TensorInfo] = {}
        for name, shape, type_id, offset in entries:
            tensors[name] = self.tensor_info(name, shape, type_id, offset, data_start, alignment, tensors)
        return metadata, tensors, data_start

    def unpack(self, fmt: str) -> tuple:
        layout = _layout(fmt)
        end = self.pos + layout.size
        if end > self.size:
            self.truncated()
        values = layout.unpack_from(self.buffer, self.pos)
        self.pos = end
        return values

    def truncated(self):
        raise SummarizeError(f"{self.path}: truncated (its header runs past the file's {self.size:,} bytes)")

    def string(self, what: str) -> str:
        (length,) = self.unpack("Q")
        if self.pos + length > self.size:
            self.truncated()
        data = self.buffer[self.pos : self.pos + length]
        self.pos += length
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise SummarizeError(f"{self.path}: not a GGUF file ({what} is not UTF-8)") from None

    def value(self, value_type: int, key: str):
        if value_type in _SCALARS:
            return self.unpack(_SCALARS[value_type])[0]
        if value_type == _STRING:
            return self.string(f"metadata {key}")
        if value_type != _ARRAY:
            raise SummarizeError(f"{self.path}: not a GGUF file (metadata {key} has unknown value type {value_type})")
        item_type, count = self.unpack("IQ")
        if count > self.size - self.pos:  # every item takes at least a byte
            raise SummarizeError(f"{self.path}: truncated (its header runs past the file's {self.size:,} bytes: "
                                 f"metadata {key} claims {count:,} items)")
        if item_type == _STRING:  # walked, not decoded: a vocabulary is decoded when a tokenizer is built
            start = pos = self.pos
            length_at, buffer, size = _layout("Q").unpack_from, self.buffer, self.size
            for _ in range(count):
                if pos + 8 > size:
                    self.truncated()
                pos += 8 + length_at(buffer, pos)[0]
            if pos > size:
                self.truncated()
            self.pos = pos
            return StringList(start, pos, count)
        if item_type in _SCALARS:
            return list(self.unpack(f"{count}{_SCALARS[item_type]}"))
        return [self.value(item_type, key) for _ in range(count)]

    def tensor_entry(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self.string("a tensor name")
        (n_dims,) = self.unpack("I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise SummarizeError(f"{self.path}: tensor {name} has {n_dims} dimensions (GGUF allows 1 to {MAX_DIMS})")
        dims = self.unpack(f"{n_dims}Q")
        type_id, offset = self.unpack("IQ")
        return name, tuple(reversed(dims)), type_id, offset

    def tensor_info(self, name: str, shape: tuple[int, ...], type_id: int, offset: int, data_start: int,
                    alignment: int, seen: dict) -> TensorInfo:
        if name in seen:
            raise SummarizeError(f"{self.path}: tensor {name} appears twice")
        if min(shape) < 1 or math.prod(shape) > self.size * 8:  # even 1-bit kinds need a byte for 8 values
            raise SummarizeError(f"{self.path}: tensor {name} has impossible dimensions {shape}")
        if offset % alignment:
            raise SummarizeError(f"{self.path}: tensor {name} starts at offset {offset}, not a multiple of {alignment}")
        kind = GGML_TYPES.get(type_id)
        if kind is None:  # its size is unknown; reading it says so
            return TensorInfo(name, shape, None, type_id, data_start + offset, 0)
        if shape[-1] % kind.elements:
            raise SummarizeError(f"{self.path}: tensor {name} has rows of {shape[-1]} values, "
                                 f"not whole {kind.name} blocks of {kind.elements}")
        nbytes = math.prod(shape) // kind.elements * kind.nbytes
        end = data_start + offset + nbytes
        if end > self.size:
            raise SummarizeError(f"{self.path}: truncated; tensor {name} ends at byte {end:,}, the file has {self.size:,}")
        return TensorInfo(name, shape, kind, type_id, data_start + offset, nbytes)

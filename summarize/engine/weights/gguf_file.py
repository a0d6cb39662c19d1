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
keeps (`Form`): the model's dtype, or for a projection the file's own codes and group scales
(`Int4Groups` for Q4_0, Q4_1, Q4_K; `Int8Groups` for Q8_0, Q6_K). `GGUFFile.form_of` is the one
place that decides which.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from summarize.engine.memory import release_free_memory
from summarize.engine.ops import machine
from summarize.engine.ops.linear import Int4Groups, Int8Groups
from summarize.engine.weights.gguf_quants import (
    GGML_TYPES,
    INT4_GROUP,
    INT4_KINDS,
    INT8_GROUPS,
    GGMLType,
    can_dequantize,
    dequantize,
    int4_groups,
    int8_groups,
)
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


@dataclass(frozen=True)
class Form:
    """What a tensor is read into: "int4" (`Int4Groups`), "int8" (`Int8Groups`) or "dense" (the
    model's dtype); for "dense", why a quantized kind was widened (None: the common reason)."""

    name: str
    why: str | None = None


DENSE = Form("dense")
NO_KERNEL = "no kernel here keeps them compact"  # the common reason: a kind or a tensor with no compact form
COMPACT_KINDS = INT4_KINDS | frozenset(INT8_GROUPS)


def group_order(index: Tensor, group: int) -> Tensor | None:
    """For a reorder `index` [K] of input channels that moves whole groups of `group`, the order of
    the groups [K/group]; None where it splits one."""
    runs = index.view(-1, group)
    starts = runs[:, :1]
    if bool((starts % group == 0).all()) and torch.equal(runs - starts, torch.arange(group).expand_as(runs)):
        return starts[:, 0] // group
    return None


class GGUFFile:
    """A GGUF file's metadata (`metadata`, `get`, `strings`) and tensors (`tensors`, `read`).

    Everything about the file is checked when it is opened (magic, version, every size and offset
    against the file's length), so a truncated or corrupt file is a one-line SummarizeError naming
    it before anything is allocated.
    """

    def __init__(self, path: str | os.PathLike, *, int4: bool = True) -> None:
        self.path = Path(path)
        self.int4 = int4  # projections may be kept on torch's int4 kernel (its tensors go to the CPU)
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
        self.widened: Counter[tuple[str, str]] = Counter()  # (quantized kind, why) read into the model's dtype: tensors
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

    def form_of(self, tensors: Sequence[str], columns: Tensor | None = None) -> Form:
        """The form a projection made of `tensors` (stacked by rows, then its input channels
        reordered by `columns`) is read in: each part's own where they share one, else the widest
        that one of them needs.

        A part's own: Q4_0, Q4_1, Q4_K int4, where torch's int4 kernel takes the stack (on the CPU,
        its rows a multiple of the packing block); Q8_0, Q6_K int8 groups; any other kind dense.
        Widest: int4 parts go to int8 groups only if their offset is −8 · scale (Q4_0, whose codes
        − 8 are int8 values on its scale, exactly); any other mix is dense, widened. A reorder of
        input channels that splits a group makes the projection dense too."""
        infos = [self.tensors.get(t) for t in tensors]
        if any(info is None or info.kind is None or len(info.shape) != 2 for info in infos):
            return DENSE  # a missing or odd tensor: reading it says what is wrong
        kinds = {info.kind.name for info in infos}
        rows = sum(info.shape[0] for info in infos)
        if kinds <= INT4_KINDS:
            block = machine.POLICY.int4_block_rows
            if self.int4 and block is not None and rows % block == 0:
                form, group = Form("int4"), INT4_GROUP
            elif kinds == {"Q4_0"}:
                form, group = Form("int8"), INT8_GROUPS["Q4_0"]
            elif not self.int4:
                return Form("dense", "torch's int4 kernel runs on the CPU only")
            else:
                return Form("dense", f"torch's int4 kernel here takes no matrix of {rows} rows")
        elif kinds <= INT8_GROUPS.keys():
            form, group = Form("int8"), min(INT8_GROUPS[kind] for kind in kinds)
        else:
            return Form("dense", "stacked into one matrix with parts of another form" if len(kinds) > 1 else None)
        if columns is not None and group_order(columns, group) is None:
            return Form("dense", f"a reorder of input channels splits their groups of {group}")
        return form

    def read(self, name: str, *, dtype: torch.dtype, form: Form = DENSE) -> Tensor | Int8Groups | Int4Groups:
        """The tensor `name` in PyTorch's shape, converted to `dtype`; or a matrix in the compact
        `form` that `form_of` chose for it, exactly as stored. Read a bounded run of rows at a time."""
        info = self.tensors.get(name)
        if info is None:
            raise SummarizeError(f"{self.path}: no tensor {name}")
        kind = info.kind
        if kind is None:
            raise SummarizeError(f"{self.path}: tensor {name} is of GGML type {info.type_id}, which this version does not know")
        if kind.float_dtype is None and not can_dequantize(kind):
            raise SummarizeError(f"{self.path}: tensor {name} is {kind.name}, which holds no weights summarize can read")
        if form.name != "dense":
            return self._read_groups(info, form, dtype)
        out = torch.empty(math.prod(info.shape[:-1]), info.shape[-1], dtype=dtype)
        if kind.float_dtype == dtype:  # stored as the model keeps it: read in place
            with open(self.path, "rb") as f:
                f.seek(info.offset)
                self._read_into(f, out, name)
        else:
            for start, values in self._runs(info):
                out[start : start + values.shape[0]] = values
        if kind.float_dtype is None:
            self.widened[kind.name, form.why if kind.name in COMPACT_KINDS and form.why else NO_KERNEL] += 1
            self.widened_to = dtype
        return out.view(info.shape)

    def _read_groups(self, info: TensorInfo, form: Form, dtype: torch.dtype) -> Int8Groups | Int4Groups:
        """A matrix as its codes and group scales: int4 (Q4_0, Q4_1, Q4_K) or int8 (Q8_0, Q6_K, Q4_0)."""
        (rows, width), kind = info.shape, info.kind
        parts: list[Tensor] = []  # codes or values [rows, width], then scales (and offsets) [rows, groups]
        for start, blocks in self._runs(info, blocks=True):
            decoded = int4_groups(kind, blocks) if form.name == "int4" else int8_groups(kind, blocks)
            n = blocks.shape[0] * kind.elements // width
            if not parts:
                parts = [torch.empty(rows, t.numel() // n, dtype=t.dtype) for t in decoded]
            for whole, run in zip(parts, decoded):
                whole[start : start + n] = run.view(n, -1)
        return Int4Groups(*parts, dtype) if form.name == "int4" else Int8Groups(*parts, dtype)

    def _runs(self, info: TensorInfo, *, blocks: bool = False):
        """(first row, run) for bounded runs of the tensor's rows: its values in fp32 (or its own
        float dtype), or with `blocks` its raw blocks [n · blocks per row, nbytes]."""
        kind = info.kind
        rows, width = math.prod(info.shape[:-1]), info.shape[-1]
        row_bytes = width // kind.elements * kind.nbytes
        step = max(1, READ_CHUNK_BYTES // (width * 4))
        raw = torch.empty(min(step, rows) * row_bytes, dtype=torch.uint8)
        with open(self.path, "rb") as f:
            f.seek(info.offset)
            for start in range(0, rows, step):
                n = min(step, rows - start)
                chunk = raw[: n * row_bytes]
                self._read_into(f, chunk, info.name)
                if blocks:
                    yield start, chunk.view(-1, kind.nbytes)
                elif kind.float_dtype is not None:
                    yield start, chunk.view(kind.float_dtype).view(n, width)
                else:
                    yield start, dequantize(kind, chunk.view(-1, kind.nbytes)).view(n, width)
        if info.nbytes > READ_CHUNK_BYTES:
            # the runs' freed temporaries, which glibc would keep in its heaps (fragmented by the
            # tensors kept between them): without this, loading peaks ~8% above the weights it keeps
            release_free_memory()

    def widening_note(self) -> str | None:
        """One line naming the quantized kinds that were read into the model's dtype, if any, and why."""
        if not self.widened:
            return None
        reasons: dict[str, list[str]] = {}
        for (kind, why), count in sorted(self.widened.items()):
            reasons.setdefault(why, []).append(f"{kind} ({count} tensor{'s' * (count > 1)})")
        dtype = str(self.widened_to).removeprefix("torch.")
        return f"{self.path.name}: " + "; ".join(f"{', '.join(kinds)} widened to {dtype}: {why}" for why, kinds in reasons.items())

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

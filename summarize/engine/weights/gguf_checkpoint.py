"""A GGUF file seen through a family's name table: the checkpoint surface `build` reads
(`in`, `names()`, `shape()`, `read()`, `folder`), each name made from GGUF tensors by a `Source`.

A family's GGUF module (`qwen3_5_gguf`, `rwkv7_gguf`) writes the table: which GGUF tensors make
each tensor the model reads, and how the converter's transforms are undone. Tensors read here
arrive in the model's dtype (vectors in fp32, as the file keeps them), or, for a projection, in the
compact form `GGUFFile.form_of` chose for it (`Int4Groups`, `Int8Groups`: the file's own codes and
group scales), which the reorders below keep.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from summarize.engine.ops.linear import Int4Groups, Int8Groups
from summarize.engine.weights.gguf_file import DENSE, Form, GGUFFile, group_order
from summarize.errors import SummarizeError

Weight = Tensor | Int8Groups | Int4Groups


def _first(parts: Sequence[Weight]) -> Weight:
    return parts[0]


@dataclass(frozen=True)
class Source:
    """How one tensor the model reads is made from the file."""

    tensors: tuple[str, ...]  # the GGUF tensors it is made of
    stored: tuple[tuple[int, ...], ...]  # the shape each must have in the file (PyTorch's order)
    shape: tuple[int, ...]  # the shape the family reads
    make: Callable[[Sequence[Weight]], Weight] = _first  # the converter's transform, undone
    form: Form = DENSE  # a projection: the form it is read in (`GGUFFile.form_of`)
    fp32: bool = False  # a vector (norm, bias, decay): read in fp32, as the file keeps it


class GGUFCheckpoint:
    """The tensors of `file` under a family's names (`table`), read one at a time in `dtype`."""

    def __init__(self, file: GGUFFile, table: dict[str, Source], dtype: torch.dtype) -> None:
        self.file, self.table, self.dtype = file, table, dtype
        self.folder = file.path  # named in the family's messages
        self.config_where = f"{file.path} (its metadata)"

    def __contains__(self, name: str) -> bool:
        return name in self.table

    def names(self) -> list[str]:
        return list(self.table)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.table[name].shape

    def read(self, name: str) -> Weight:
        source = self.table.get(name)
        if source is None:
            raise KeyError(name)  # the family asked for a name its own table lacks: a bug, not a bad file
        for tensor, shape in zip(source.tensors, source.stored):
            info = self.file.tensors.get(tensor)
            if info is not None and info.shape != shape:
                raise SummarizeError(f"{self.file.path}: tensor {tensor} has shape {info.shape}; the metadata says {shape}")
        parts = [self.file.read(t, dtype=torch.float32 if source.fp32 else self.dtype, form=source.form) for t in source.tensors]
        return source.make(parts)


def take_rows(weight: Weight, index: Tensor) -> Weight:
    """weight[index] (rows reordered), for dense and grouped weights alike: groups run along rows."""
    if isinstance(weight, Int8Groups):
        return Int8Groups(weight.values[index], weight.scale[index], weight.dtype)
    if isinstance(weight, Int4Groups):
        return Int4Groups(weight.codes[index], weight.scale[index], weight.offset[index], weight.dtype)
    return weight[index]


def take_columns(weight: Weight, index: Tensor) -> Weight:
    """weight[:, index] (input channels reordered). A grouped weight's groups move with their
    channels, which must move whole groups (`GGUFFile.form_of` reads one whose reorder does not dense)."""
    if isinstance(weight, Tensor):
        return weight[:, index].contiguous()
    groups = group_order(index, weight.group)
    if groups is None:
        raise ValueError(f"a reorder of input channels that splits groups of {weight.group}")
    if isinstance(weight, Int8Groups):
        return Int8Groups(weight.values[:, index].contiguous(), weight.scale[:, groups].contiguous(), weight.dtype)
    return Int4Groups(weight.codes[:, index].contiguous(), weight.scale[:, groups].contiguous(),
                      weight.offset[:, groups].contiguous(), weight.dtype)

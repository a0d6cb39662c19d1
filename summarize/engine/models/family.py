"""The contract a model family's module declares: what it loads, how it builds, its tokenizer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Family:
    """One family of models, as its module exports it under the name `FAMILY`.

    build(config: dict, checkpoint, *, device, dtype, quantize) -> model: the model, its tensors'
        names and shapes checked (`checkpoint` answers `in`, names(), shape(), read(), folder).
    load_tokenizer(source: Path) -> (tokenizer, stop ids): `source` is the model's folder.
    model_types: the config.json `model_type`s the family reads.
    file_suffixes: single weight files it reads without a config.json (a BlinkDL `.pth`, say).
    claims(checkpoint) -> bool: for a suffix that several families read, whether this file is this
        family's, from its tensor names (None: every file with the suffix).
    quantize_modes: the `quantize` values `build` accepts besides None.
    gguf_archs: the GGUF `general.architecture`s it reads, through
    read_gguf(file: GGUFFile, dtype) -> (config: dict, checkpoint): the file's settings as config.json
        would give them, and its tensors under the names `build` reads (llama.cpp's transforms undone).
    """

    name: str
    build: Callable
    load_tokenizer: Callable[[Path], tuple]
    model_types: tuple[str, ...] = ()
    file_suffixes: tuple[str, ...] = ()
    claims: Callable[[object], bool] | None = None
    quantize_modes: tuple[str, ...] = ()
    label: str = ""  # how messages name it ("Qwen3.5")
    gguf_archs: tuple[str, ...] = ()
    read_gguf: Callable | None = None

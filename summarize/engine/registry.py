"""The model families the engine knows: a new family is one module with a `FAMILY`, named here."""

from __future__ import annotations

from summarize.engine import qwen3_5, rwkv7
from summarize.engine.family import Family

FAMILIES: tuple[Family, ...] = (qwen3_5.FAMILY, rwkv7.FAMILY)


def family_named(name: str) -> Family:
    return next(family for family in FAMILIES if family.name == name)


def family_for_model_type(model_type: str | None) -> Family | None:
    return next((family for family in FAMILIES if model_type in family.model_types), None)


def family_for_file(suffix: str) -> Family | None:
    return next((family for family in FAMILIES if suffix in family.file_suffixes), None)


def family_for_gguf_arch(arch: str) -> Family | None:
    return next((family for family in FAMILIES if arch in family.gguf_archs), None)


def supported_gguf_archs() -> list[str]:
    return [arch for family in FAMILIES for arch in family.gguf_archs]


def supported_model_types() -> list[str]:
    return [model_type for family in FAMILIES for model_type in family.model_types]

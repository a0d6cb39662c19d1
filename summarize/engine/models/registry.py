"""The model families the engine knows: a new family is one module with a `FAMILY`, named here."""

from __future__ import annotations

from summarize.engine.models import qwen3_5, rwkv6, rwkv7
from summarize.engine.models.family import Family

FAMILIES: tuple[Family, ...] = (qwen3_5.FAMILY, rwkv7.FAMILY, rwkv6.FAMILY)


def family_named(name: str) -> Family:
    return next(family for family in FAMILIES if family.name == name)


def family_for_model_type(model_type: str | None) -> Family | None:
    return next((family for family in FAMILIES if model_type in family.model_types), None)


def families_for_file(suffix: str) -> list[Family]:
    """The families that read single weight files with this suffix (`.pth`: RWKV-6 and RWKV-7)."""
    return [family for family in FAMILIES if suffix in family.file_suffixes]


def family_for_checkpoint(families: list[Family], checkpoint) -> Family:
    """The first of `families` that claims the file; if none does, the first, whose `build` then
    says in one line what the file is instead."""
    return next((family for family in families if family.claims is None or family.claims(checkpoint)), families[0])


def family_for_gguf_arch(arch: str) -> Family | None:
    return next((family for family in FAMILIES if arch in family.gguf_archs), None)


def supported_gguf_archs() -> list[str]:
    return [arch for family in FAMILIES for arch in family.gguf_archs]


def supported_model_types() -> list[str]:
    return [model_type for family in FAMILIES for model_type in family.model_types]

"""`owner/name:QUANT` picks one file of a hub repository's listing, as llama.cpp's `-hf` does."""

from __future__ import annotations

import pytest

from summarize.engine.weights.gguf_source import pick_quantization
from summarize.errors import ModelNotAvailable, SummarizeError

LISTING = [
    "README.md", "Qwen3.5-0.8B-Q4_K_M.gguf", "Qwen3.5-0.8B-Q4_K_S.gguf", "Qwen3.5-0.8B-Q8_0.gguf", "Qwen3.5-0.8B-BF16.gguf",
    "mmproj-Qwen3.5-0.8B-Q8_0.gguf", "big/Qwen3.5-0.8B-Q2_K-00001-of-00002.gguf", "big/Qwen3.5-0.8B-Q2_K-00002-of-00002.gguf",
]


@pytest.mark.parametrize("tag, file", [("Q4_K_M", "Qwen3.5-0.8B-Q4_K_M.gguf"), ("q4_k_m", "Qwen3.5-0.8B-Q4_K_M.gguf"),
                                       ("Q8_0", "Qwen3.5-0.8B-Q8_0.gguf"), ("bf16", "Qwen3.5-0.8B-BF16.gguf")])
def test_the_tag_picks_its_file_and_never_the_vision_projector(tag, file):
    assert pick_quantization(LISTING, tag, "o/r") == file


def test_a_tag_matches_whole_words_only():
    with pytest.raises(ModelNotAvailable, match=r"no Q4_K GGUF file \(it has: .*Q4_K_M"):
        pick_quantization(LISTING, "Q4_K", "o/r")  # not Q4_K_M nor Q4_K_S


def test_split_models_are_refused_in_one_line():
    with pytest.raises(SummarizeError, match="split models are not supported"):
        pick_quantization(LISTING, "Q2_K", "o/r")


def test_a_repository_without_gguf_files_says_so():
    with pytest.raises(ModelNotAvailable, match="it has no GGUF files"):
        pick_quantization(["config.json", "model.safetensors"], "Q8_0", "o/r")

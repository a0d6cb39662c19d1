"""How many chunks map-reduce decodes together: a fixed memory budget, whatever the document's length.

Shapes only: the models here are built on the meta device from the released configs, so no weight
is read or allocated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from summarize.engine.models.qwen3_5 import Qwen35Config, Qwen35Model, checkpoint_shapes
from summarize.settings import DEFAULT_BATCH_MEMORY, DEFAULT_CHUNK_TOKENS, parse_size
from summarize.summarizers.map_rows import MAX_MAP_BATCH, map_batch_size, row_bytes

CONFIGS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "qwen3.5"


def shape_only_model(name: str, dtype: torch.dtype = torch.bfloat16) -> Qwen35Model:
    path = CONFIGS / f"Qwen3.5-{name}.config.json"
    if not path.exists():
        pytest.skip(f"no released config at {path}")
    cfg = Qwen35Config.from_dict(json.loads(path.read_text()), where=str(path))
    shapes = checkpoint_shapes(cfg, fused_experts=True)
    return Qwen35Model(cfg, lambda name: torch.empty(shapes[name], dtype=dtype, device="meta"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_default_budget_runs_eight_rows_of_the_0_8b_model(dtype):
    model = shape_only_model("0.8B", dtype)
    assert map_batch_size(model, DEFAULT_CHUNK_TOKENS) == MAX_MAP_BATCH == 8
    # a row: 18.6 MiB of recurrent state, plus keys and values for the prompt, chunk and notes
    assert 35 * 2**20 < row_bytes(model.new_state(1), DEFAULT_CHUNK_TOKENS) < 70 * 2**20


def test_the_budget_bounds_the_rows():
    model = shape_only_model("0.8B")
    one_row = row_bytes(model.new_state(1), DEFAULT_CHUNK_TOKENS)
    assert map_batch_size(model, DEFAULT_CHUNK_TOKENS, budget=3 * one_row) == 3
    assert map_batch_size(model, DEFAULT_CHUNK_TOKENS, budget=one_row // 2) == 1  # never fewer than one row
    assert map_batch_size(model, DEFAULT_CHUNK_TOKENS, budget=100 * one_row) == MAX_MAP_BATCH


def test_longer_chunks_mean_fewer_rows_within_the_same_budget():
    model = shape_only_model("9B")
    rows = [map_batch_size(model, chunk, DEFAULT_BATCH_MEMORY) for chunk in (512, 4096, 32768)]
    assert rows == sorted(rows, reverse=True) and rows[-1] < rows[0]


@pytest.mark.parametrize("text, size", [
    ("1G", 2**30), ("512M", 512 * 2**20), ("512MiB", 512 * 2**20), ("1.5 GB", 3 * 2**29), ("4096", 4096), ("64k", 65536),
])
def test_sizes_read_in_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "1X", "-1G", "1 G B"])
def test_what_is_not_a_size_is_refused(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)

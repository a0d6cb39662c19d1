"""A corrupt or hostile checkpoint, config or tokenizer file is a one-line SummarizeError naming
the file, never an unexpected OverflowError, MemoryError, RuntimeError, KeyError or AttributeError
(and never an allocation of the size a broken header claims)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from summarize.engine import load_model
from summarize.engine.loading import Checkpoint, read_config
from summarize.engine.models.qwen3_5 import Qwen35Config
from summarize.engine.models.rwkv7 import RWKV7Config
from summarize.engine.tokenizers.rwkv import RwkvTokenizer
from summarize.errors import SummarizeError
from tiny_models import RWKV_TINY, TEXT_CONFIG, blinkdl_checkpoint

TB = 2**40
QWEN_CONFIG = {"model_type": "qwen3_5_text", **TEXT_CONFIG}


def write_safetensors(path: Path, header, data: bytes = b"", *, length: int | None = None) -> Path:
    """A safetensors file written by hand: 8-byte little-endian header length, JSON, data."""
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def one_line_error(excinfo, file: Path) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and str(file) in message, message
    return message


# -- safetensors headers ------------------------------------------------------------------------


@pytest.mark.parametrize("length", [2**64 - 1, 64 * 2**30, 101_000_000], ids=["2^64-1", "64GB", "over-the-limit"])
def test_a_header_length_past_the_file_is_named(tmp_path, length):
    weights = write_safetensors(tmp_path / "model.safetensors", {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                                b"\0" * 4, length=length)
    with pytest.raises(SummarizeError) as excinfo:
        Checkpoint(tmp_path)
    assert "header" in one_line_error(excinfo, weights)


@pytest.mark.parametrize("entry, why", [
    ({"dtype": "F32", "shape": [4], "data_offsets": [10 * TB, 10 * TB + 16]}, "truncated or corrupt"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [0, 10 * TB]}, "truncated or corrupt"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}, "data_offsets"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [0]}, "data_offsets"),
    ({"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 16]}, "needs 64"),
    ({"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}, "shape"),
    ({"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}, "shape"),
    ({"dtype": 7, "shape": [4], "data_offsets": [0, 16]}, "dtype"),
    ([0, 16], "not an object"),
], ids=["offset-10TB", "end-10TB", "end-before-begin", "one-offset", "shape-vs-bytes", "negative-dim",
        "shape-not-a-list", "dtype-not-a-name", "entry-not-an-object"])
def test_a_tensor_entry_that_does_not_fit_the_file_is_named(tmp_path, entry, why):
    weights = write_safetensors(tmp_path / "model.safetensors", {"w": entry}, b"\0" * 16)
    with pytest.raises(SummarizeError) as excinfo:
        Checkpoint(tmp_path).read("w")  # said when the folder is opened, before any read
    assert why in one_line_error(excinfo, weights)


@pytest.mark.parametrize("header", [[1, 2], "text", None], ids=["list", "string", "null"])
def test_a_header_that_is_not_an_object_is_named(tmp_path, header):
    weights = write_safetensors(tmp_path / "model.safetensors", header)
    with pytest.raises(SummarizeError) as excinfo:
        Checkpoint(tmp_path)
    assert "not a safetensors file" in one_line_error(excinfo, weights)


def test_a_file_shorter_than_its_length_field_is_named(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\1\2")
    with pytest.raises(SummarizeError) as excinfo:
        Checkpoint(tmp_path)
    one_line_error(excinfo, weights)


def test_a_good_handmade_file_reads_back(tmp_path):
    """The checks refuse nothing valid: every dtype, an empty tensor, a scalar, metadata."""
    values = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    data = struct.pack("<6f", *range(6))
    header = {
        "__metadata__": {"format": "pt"},
        "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "empty": {"dtype": "BF16", "shape": [0, 5], "data_offsets": [24, 24]},
        "scalar": {"dtype": "I16", "shape": [], "data_offsets": [24, 26]},
        "fp8": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [26, 28]},  # never read: not checked
    }
    write_safetensors(tmp_path / "model.safetensors", header, data + b"\7\0" + b"\0\0")
    checkpoint = Checkpoint(tmp_path)
    assert torch.equal(checkpoint.read("w"), values)
    assert checkpoint.read("empty").shape == (0, 5) and checkpoint.read("empty").dtype == torch.bfloat16
    assert checkpoint.read("scalar").item() == 7
    with pytest.raises(SummarizeError, match="unsupported dtype F8_E4M3"):
        checkpoint.read("fp8")


def test_a_corrupt_header_on_the_command_line_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN_CONFIG))
    weights = write_safetensors(tmp_path / "model.safetensors", {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                                length=2**64 - 1)
    proc = subprocess.run([sys.executable, "-m", "summarize", "-", "-m", str(tmp_path)], input="Some text. " * 20,
                          capture_output=True, text=True, timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1
    assert "unexpected" not in proc.stderr and "Traceback" not in proc.stderr
    assert any(str(weights) in line and "header" in line for line in proc.stderr.splitlines()), proc.stderr


# -- config.json --------------------------------------------------------------------------------


def folder_with_config(folder: Path, config) -> Path:
    """A folder whose weights file is valid (and tiny), so that config.json is what is judged."""
    (folder / "config.json").write_text(json.dumps(config))
    write_safetensors(folder / "model.safetensors", {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    return folder


def without(config: dict, key: str) -> dict:
    return {k: v for k, v in config.items() if k != key}


@pytest.mark.parametrize("config, why", [
    (without(QWEN_CONFIG, "hidden_size"), "no hidden_size"),
    (without(QWEN_CONFIG, "num_hidden_layers"), "no num_hidden_layers"),
    ({"model_type": "qwen3_5", "text_config": without(TEXT_CONFIG, "vocab_size")}, "no text_config.vocab_size"),
    (without(QWEN_CONFIG, "intermediate_size"), "no intermediate_size"),
    (QWEN_CONFIG | {"hidden_size": "64"}, "hidden_size must be an integer"),
    (QWEN_CONFIG | {"num_attention_heads": 0, "head_dim": None}, "num_attention_heads must be an integer"),
    (QWEN_CONFIG | {"rms_norm_eps": "tiny"}, "rms_norm_eps must be a positive number"),
    (QWEN_CONFIG | {"rope_parameters": [1]}, "rope_parameters is not an object"),
    (QWEN_CONFIG | {"layer_types": ["linear_attention", "sliding_attention"] * 2}, "layer_types"),
    (QWEN_CONFIG | {"layer_types": ["linear_attention"]}, "layer_types"),
    ({"model_type": "qwen3_5", "text_config": [1]}, "text_config is not an object"),
    ([1, 2], "not a JSON object"),
    ("qwen3_5", "not a JSON object"),
], ids=["no-hidden_size", "no-layers", "text_config-no-vocab", "dense-no-mlp-width", "string-size", "zero-heads",
        "string-eps", "rope-list", "unknown-layer-type", "too-few-layer-types", "text_config-list", "list", "string"])
def test_a_config_that_lacks_or_mistypes_a_setting_is_named(tmp_path, config, why):
    folder = folder_with_config(tmp_path, config)
    with pytest.raises(SummarizeError) as excinfo:
        load_model(folder, device="cpu", dtype=torch.float32)
    assert why in one_line_error(excinfo, folder / "config.json")


@pytest.mark.parametrize("config", [[1], "x", None])
def test_from_dict_refuses_what_is_not_a_dict(config):
    with pytest.raises(SummarizeError, match="config.json: not a JSON object"):
        Qwen35Config.from_dict(config)


def test_read_config_refuses_bytes_that_are_no_text(tmp_path):
    (tmp_path / "config.json").write_bytes(b"\xff\xfe\xfa{")
    with pytest.raises(SummarizeError) as excinfo:
        read_config(tmp_path)
    one_line_error(excinfo, tmp_path / "config.json")


def test_the_real_configs_still_read():
    for path in sorted((Path(__file__).resolve().parents[2] / "shared" / "reference" / "qwen3.5").glob("*.config.json")):
        cfg = Qwen35Config.from_dict(json.loads(path.read_text()))
        assert cfg.hidden_size > 0 and len(cfg.layer_types) > 0, path.name


# -- RWKV-7 sizes and settings ------------------------------------------------------------------


@pytest.fixture(scope="module")
def rwkv_tensors(tmp_path_factory) -> dict[str, torch.Tensor]:
    path = blinkdl_checkpoint(tmp_path_factory.mktemp("rwkv") / "model.pth", **RWKV_TINY)
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize("change, why", [
    ({"blocks.0.att.w1": None}, "lacks tensor blocks.0.att.w1"),
    ({"blocks.0.ffn.key.weight": None}, "lacks tensor blocks.0.ffn.key.weight"),
    ({"emb.weight": torch.zeros(512 * 64)}, "emb.weight has shape (32768,)"),
    ({"blocks.0.att.r_k": torch.zeros(2, 32, 1)}, "r_k has shape (2, 32, 1)"),
    ({"blocks.0.att.r_k": torch.zeros(3, 21)}, "3 heads of 21"),  # 63 channels: 64 // 21 heads would load
], ids=["no-w1", "no-ffn", "emb-1d", "r_k-3d", "heads-vs-channels"])
def test_a_pth_whose_sizing_tensors_are_missing_or_misshaped_is_named(tmp_path, rwkv_tensors, change, why):
    tensors = {k: v for k, v in (rwkv_tensors | change).items() if v is not None}
    path = tmp_path / "model.pth"
    torch.save(tensors, path)
    with pytest.raises(SummarizeError) as excinfo:
        load_model(path, device="cpu", dtype=torch.float32)
    assert why in one_line_error(excinfo, path)


@pytest.mark.parametrize("config, why", [
    ({"model_type": "rwkv7", "norm_eps": "1e-5"}, "norm_eps must be a positive number"),
    ({"model_type": "rwkv7", "norm_eps": -1}, "norm_eps must be a positive number"),
    ([1], "not a JSON object"),
])
def test_rwkv_config_settings_are_checked(rwkv_tensors, config, why):
    def shape(name):
        return tuple(rwkv_tensors[name].shape) if name in rwkv_tensors else None

    with pytest.raises(SummarizeError, match=why) as excinfo:
        RWKV7Config.from_shapes(shape, config, where="/models/rwkv")
    assert "/models/rwkv/config.json" in str(excinfo.value)


# -- the RWKV vocabulary ------------------------------------------------------------------------


@pytest.mark.parametrize("content, why", [
    (b"\xff\xfe not utf-8\n", "not a readable vocabulary"),
    (b"", "no tokens"),
    (b"1 'a' 1\n", "lacks single-byte tokens"),
], ids=["not-utf8", "empty", "no-single-bytes"])
def test_a_broken_vocabulary_is_named(tmp_path, content, why):
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(content)
    with pytest.raises(SummarizeError, match=why) as excinfo:
        RwkvTokenizer.from_file(vocab)
    one_line_error(excinfo, vocab)

"""A broken or foreign GGUF file is one line naming it and what is wrong, through `load_model` and
through the command line (exit 1, no traceback), never an unexpected exception or a huge allocation.

The files are ones llama.cpp's converter wrote (tests/llama_cpp.py), cut short or with a few bytes
changed where the format puts them.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch

import llama_cpp
from summarize.engine import ModelNotAvailable, load_model
from summarize.engine.weights.gguf_file import GGUFFile
from summarize.errors import SummarizeError
from tiny_models import RWKV_TINY, blinkdl_checkpoint, hf_layout

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rwkv_folder(tmp_path_factory) -> Path:
    """A tiny RWKV-7 in the Hugging Face layout, as the converter reads it (quick to convert and load)."""
    scratch = tmp_path_factory.mktemp("rwkv-bad")
    sizes = RWKV_TINY | dict(vocab=65536, head_size=64, layers=2)
    folder = hf_layout(blinkdl_checkpoint(scratch / "tiny.pth", **sizes), scratch / "rwkv7-bad")
    ranks = sizes["ranks"]
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["RWKV7ForCausalLM"], "model_type": "rwkv7", "vocab_size": sizes["vocab"],
        "hidden_size": sizes["hidden"], "head_dim": sizes["head_size"], "num_hidden_layers": sizes["layers"],
        "intermediate_size": sizes["ffn"], "norm_eps": 1e-5, "decay_low_rank_dim": ranks["w"],
        "a_low_rank_dim": ranks["a"], "v_low_rank_dim": ranks["v"], "gate_low_rank_dim": ranks["g"],
    }))
    shutil.copy(ROOT / "summarize" / "data" / "rwkv_vocab_v20230424.txt", folder)
    return folder


@pytest.fixture(scope="module")
def good(rwkv_folder) -> bytes:
    return llama_cpp.convert(rwkv_folder, "q8_0").read_bytes()


def write(tmp_path: Path, data: bytes, name: str = "model.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def type_field(data: bytes, tensor: str) -> int:
    """Where the GGML type of `tensor` sits in its header entry: after its name, dimension count and dimensions."""
    at = data.index(struct.pack("<Q", len(tensor)) + tensor.encode()) + 8 + len(tensor)
    (n_dims,) = struct.unpack_from("<I", data, at)
    return at + 4 + 8 * n_dims


def renamed(data: bytes, old: str, new: str) -> bytes:
    assert len(old) == len(new) and data.count(old.encode()) == 1
    return data.replace(old.encode(), new.encode())


def retyped(data: bytes, tensor: str, type_id: int) -> bytes:
    at = type_field(data, tensor)
    return data[:at] + struct.pack("<I", type_id) + data[at + 4 :]


CASES = {
    "truncated-data": (lambda d: d[: len(d) * 3 // 4], "truncated; tensor"),
    "truncated-header": (lambda d: d[:5000], "truncated (its header runs past"),
    "wrong-magic": (lambda d: b"GGML" + d[4:], "not a GGUF file (it starts with b'GGML'"),
    "empty": (lambda d: b"", "not a GGUF file (0 bytes)"),
    "unsupported-arch": (lambda d: d.replace(b"rwkv7", b"rwkv6", 1),
                         "architecture 'rwkv6' is not supported (supported: qwen35, qwen35moe, rwkv7)"),
    "missing-tensor": (lambda d: renamed(d, "blk.1.time_mix_key.weight", "blk.1.time_mix_kex.weight"),
                       "no tensor blk.1.time_mix_key.weight"),
    "unknown-type": (lambda d: retyped(d, "blk.0.time_mix_key.weight", 99),
                     "tensor blk.0.time_mix_key.weight is of GGML type 99, which this version does not know"),
    "integer-type": (lambda d: retyped(d, "blk.0.time_mix_value.weight", 24),  # I8
                     "tensor blk.0.time_mix_value.weight is I8, which holds no weights"),
    "version": (lambda d: d[:4] + struct.pack("<I", 7) + d[8:], "GGUF version 7 is not supported"),
    "absurd-counts": (lambda d: d[:8] + struct.pack("<Q", 2**60) + d[16:], "it claims"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_file_is_one_line_naming_it(tmp_path, good, case):
    change, why = CASES[case]
    path = write(tmp_path, change(good))
    with pytest.raises(SummarizeError) as excinfo:
        load_model(path, device="cpu", dtype=torch.float32, compile=False)
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(str(path)) and why in message, message


@pytest.mark.parametrize("case", ["truncated-data", "wrong-magic", "unsupported-arch", "missing-tensor", "unknown-type"])
def test_the_command_line_says_it_in_one_line(tmp_path, good, case, run_cli):
    change, why = CASES[case]
    path = write(tmp_path, change(good))
    doc = tmp_path / "doc.txt"
    doc.write_text("A short document. It has two sentences.\n")
    result = run_cli(str(doc), "-m", str(path), "-n", "20", env={"NO_COLOR": "1"})
    assert result.exit_code == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    said = [line for line in result.stderr.splitlines() if why in line]
    assert len(said) == 1 and said[0].startswith("error: "), result.stderr


def test_a_big_endian_file_is_refused(rwkv_folder, tmp_path):
    path = llama_cpp.convert(rwkv_folder, "f32", "--bigendian")
    with pytest.raises(SummarizeError, match="big-endian"):
        load_model(path, device="cpu", compile=False)


def test_a_missing_file_is_not_available(tmp_path):
    with pytest.raises(ModelNotAvailable, match="no such GGUF file"):
        load_model(tmp_path / "nothing.gguf", device="cpu")


def test_the_header_is_checked_before_any_tensor_is_read(tmp_path, good):
    """An offset past the end is said when the file is opened."""
    at = type_field(good, "output.weight") + 4
    path = write(tmp_path, good[:at] + struct.pack("<Q", 2**40) + good[at + 8 :])
    with pytest.raises(SummarizeError, match="truncated; tensor output.weight ends at byte"):
        GGUFFile(path)

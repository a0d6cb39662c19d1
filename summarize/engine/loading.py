"""Find a checkpoint (local folder, hub id or `.pth` file), read its config, and build the model lazily.

Tensors are read one at a time from memory-mapped safetensors files and converted straight to
the target device and dtype, so peak memory is about one copy of the weights. Tensors the model
does not use (a vision tower, an MTP head) are never read. A BlinkDL `.pth` (RWKV-7) is opened
memory-mapped with `weights_only=True`, which never runs code from the file.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from summarize.engine import qwen3_5, rwkv7
from summarize.errors import SummarizeError

FAMILIES = (qwen3_5, rwkv7)  # each module: MODEL_TYPES and build(config, checkpoint, device=, dtype=)

HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.pth"]


class ModelNotAvailable(SummarizeError):
    """The model could not be found locally nor downloaded."""


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA and on CPUs with native bf16 matmuls (faster and accurate enough), else fp32."""
    if device.type == "cuda":
        return torch.bfloat16
    if device.type == "cpu" and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.bfloat16
    return torch.float32


def resolve_source(source: str | os.PathLike) -> Path:
    """A local folder as it is, or a hub id downloaded to (or found in) the standard cache."""
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotAvailable(f"{source}: a model is a folder with config.json and *.safetensors")
        return path
    source = str(source)
    if source.count("/") != 1 or source.startswith((".", "/")):
        raise ModelNotAvailable(f"{source}: no such model folder, and not a hub id (owner/name)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=source, allow_patterns=HUB_FILES))
    except Exception as exc:  # offline, not cached, gated, no such repo: all mean "not available"
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        why = "offline and not in the local cache" if offline else "not in the local cache and the download failed"
        raise ModelNotAvailable(f"model {source} is not available ({why})") from exc


def read_config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise ModelNotAvailable(f"{folder}: no config.json") from None
    except json.JSONDecodeError as exc:
        raise SummarizeError(f"{folder / 'config.json'}: not valid JSON ({exc.msg})") from None


class Checkpoint:
    """The tensors of a folder's safetensors files, by name, read lazily and one at a time."""

    def __init__(self, folder: Path, stack: ExitStack) -> None:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ModelNotAvailable(f"{folder}: no *.safetensors weights")
        self.folder = folder
        self._where: dict[str, object] = {}
        for file in files:
            handle = stack.enter_context(safe_open(str(file), framework="pt"))
            for name in handle.keys():
                self._where[name] = handle

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._where[name].get_slice(name).get_shape())

    def read(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise SummarizeError(f"{self.folder}: checkpoint lacks tensor {name}")
        return self._where[name].get_tensor(name)


class TorchCheckpoint:
    """The tensors of a `.pth` file (a BlinkDL RWKV checkpoint), memory-mapped, same surface as Checkpoint."""

    def __init__(self, path: Path) -> None:
        self.folder = path  # named in messages
        try:
            tensors = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # not a zip checkpoint, pickled code refused, truncated file
            raise SummarizeError(f"{path}: not a readable PyTorch checkpoint ({exc})") from None
        if not isinstance(tensors, dict) or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
            raise SummarizeError(f"{path}: not a checkpoint of named tensors")
        self._tensors: dict[str, torch.Tensor] = tensors

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def names(self) -> list[str]:
        return list(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def read(self, name: str) -> torch.Tensor:
        if name not in self._tensors:
            raise SummarizeError(f"{self.folder}: checkpoint lacks tensor {name}")
        return self._tensors[name]


def load_model(source: str | os.PathLike, device: str | torch.device | None = None, dtype: torch.dtype | None = None):
    """Load a recurrent-state model from a local folder, a hub id or an RWKV-7 `.pth` file (design §5)."""
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype or default_dtype(device)
    path = Path(source).expanduser()
    if path.suffix == ".pth":
        if not path.is_file():
            raise ModelNotAvailable(f"{source}: no such checkpoint file")
        model = rwkv7.build({}, TorchCheckpoint(path), device=device, dtype=dtype)
        model.source = path.parent
        return model
    folder = resolve_source(source)
    config = read_config(folder)
    model_type = config.get("model_type") or config.get("text_config", {}).get("model_type")
    family = next((f for f in FAMILIES if model_type in f.MODEL_TYPES), None)
    if family is None:
        supported = ", ".join(t for f in FAMILIES for t in f.MODEL_TYPES)
        raise SummarizeError(f"{folder}: unsupported model_type {model_type!r} (supported: {supported})")
    with ExitStack() as stack:
        checkpoint = Checkpoint(folder, stack)
        model = family.build(config, checkpoint, device=device, dtype=dtype)
    model.source = folder
    return model


def load_tokenizer(model):
    """The tokenizer that goes with a loaded model, and the token ids that end its answers."""
    if model.family == rwkv7.FAMILY:
        from summarize.engine.rwkv_tokenizer import RwkvTokenizer

        tokenizer = RwkvTokenizer.default()
        return tokenizer, tokenizer.stop_ids
    from summarize.engine.tokenizer import Tokenizer, load_stop_ids

    path = Path(model.source) / "tokenizer.json"
    if not path.is_file():
        raise SummarizeError(f"{model.source}: no tokenizer.json beside the weights")
    tokenizer = Tokenizer.from_file(path)
    return tokenizer, load_stop_ids(model.source, tokenizer)

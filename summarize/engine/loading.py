"""Find a checkpoint (local folder or hub id), read its config, and build the model lazily.

Tensors are read one at a time from memory-mapped safetensors files and converted straight to
the target device and dtype, so peak memory is about one copy of the weights. Tensors the model
does not use (a vision tower, an MTP head) are never read.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from summarize.engine import qwen3_5
from summarize.errors import SummarizeError

HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.pth"]
FP32_ALWAYS = torch.float32  # tensors a family asks for in fp32 (decay parameters) stay fp32


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

    def read(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise SummarizeError(f"{self.folder}: checkpoint lacks tensor {name}")
        return self._where[name].get_tensor(name)


def load_model(source: str | os.PathLike, device: str | torch.device | None = None, dtype: torch.dtype | None = None):
    """Load a recurrent-state model from a local folder or a hub id (design §5)."""
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype or default_dtype(device)
    folder = resolve_source(source)
    config = read_config(folder)
    model_type = config.get("model_type") or config.get("text_config", {}).get("model_type")
    if model_type in qwen3_5.MODEL_TYPES:
        family = qwen3_5
    else:
        raise SummarizeError(f"{folder}: unsupported model_type {model_type!r} (supported: {', '.join(qwen3_5.MODEL_TYPES)})")
    with ExitStack() as stack:
        checkpoint = Checkpoint(folder, stack)
        model = family.build(config, checkpoint, device=device, dtype=dtype)
    model.source = folder
    return model

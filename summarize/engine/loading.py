"""Find a checkpoint (local folder, hub id, a family's single weight file or a GGUF file), read its
config, and build the model of the family that reads it, lazily.

Tensors are read one at a time from the safetensors files and converted straight to the target
device and dtype, so peak memory is about one copy of the weights. Tensors the model
does not use (a vision tower, an MTP head) are never read. A `.pth` file is opened
memory-mapped with `weights_only=True`, which never runs code from the file. A GGUF file brings
its config and tokenizer in its metadata (`gguf_file`, `gguf_source`, the families' GGUF modules).
"""

from __future__ import annotations

import json
import math
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import torch

from summarize.engine.compiled import compile_steps, prepare_compiler, wanted
from summarize.engine.memory import available_bytes, bound_kernel_caches, release_free_memory
from summarize.engine.models.family import Family
from summarize.engine.models.registry import (
    FAMILIES,
    families_for_file,
    family_for_checkpoint,
    family_for_gguf_arch,
    family_for_model_type,
    family_named,
    supported_gguf_archs,
    supported_model_types,
)
from summarize.engine.ops import machine
from summarize.engine.ops.calibration import calibrate_model
from summarize.engine.ops.linear import INT4_GROUP, QUANTIZATIONS, Projection, int4_takes
from summarize.engine.tokenizers.gguf import load_gguf_tokenizer
from summarize.engine.weights.gguf_file import GGUFFile
from summarize.engine.weights.gguf_source import gguf_file_for
from summarize.engine.weights.ollama_store import is_ollama_name
from summarize.engine.weights.safetensors_file import HEADER_LENGTH_BYTES, MAX_HEADER_BYTES, SAFETENSORS_DTYPES, bytes_of
from summarize.errors import ModelNotAvailable, SummarizeError, first_line

QUANTIZE_MODES = (None, "auto", *QUANTIZATIONS)
# "auto" keeps an int4 copy for generating only where it leaves at least this share of the memory
# available before it free: what the model's reading and the rest of the machine need
COPY_MAX_SHARE_OF_AVAILABLE = 0.5

HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.pth"]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA; on a CPU the machine policy's (bf16 where the CPU multiplies it, else fp32)."""
    if device.type == "cuda":
        return torch.bfloat16
    if device.type == "cpu":
        return machine.POLICY.dtype
    return torch.float32


def resolve_source(source: str | os.PathLike) -> Path:
    """A local folder as it is, or a hub id downloaded to (or found in) the standard cache."""
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotAvailable(f"{source}: a model is a folder with config.json and *.safetensors, a .gguf file "
                                    "or an RWKV-7 .pth")
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
    """config.json as a dict (a file that is not a JSON object is a one-line error naming it)."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ModelNotAvailable(f"{folder}: no config.json") from None
    except json.JSONDecodeError as exc:
        raise SummarizeError(f"{path}: not valid JSON ({exc.msg})") from None
    except (UnicodeDecodeError, RecursionError):  # bytes that are no text; nesting too deep to parse
        raise SummarizeError(f"{path}: not valid JSON") from None
    except OSError as exc:  # a folder of that name, no permission
        raise SummarizeError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not isinstance(config, dict):
        raise SummarizeError(f"{path}: not a JSON object of settings (a {type(config).__name__})")
    if config.get("text_config") is not None and not isinstance(config["text_config"], dict):
        raise SummarizeError(f"{path}: text_config is not an object (a {type(config['text_config']).__name__})")
    return config


class Checkpoint:
    """The tensors of a folder's safetensors files, by name, read one at a time.

    Each tensor is read with plain file reads straight into memory of its own, not through a
    memory map: a mapped file's pages would stay in the process's resident memory beside the
    converted weights, and peak memory would be two copies instead of one. Every header is
    checked against its file when the folder is opened (its length, each tensor's shape, dtype
    and byte range), so a corrupt file is a one-line error naming it, never a huge allocation.
    """

    def __init__(self, folder: Path) -> None:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ModelNotAvailable(f"{folder}: no *.safetensors weights")
        self.folder = folder
        self._where: dict[str, tuple[Path, dict, int]] = {}  # name -> (file, entry, data start)
        for file in files:
            header, data_start = _read_header(file)
            data_bytes = file.stat().st_size - data_start
            for name, entry in header.items():
                if name != "__metadata__":
                    _check_entry(file, name, entry, data_bytes)
                    self._where[name] = (file, entry, data_start)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._where[name][1]["shape"])

    def read(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise SummarizeError(f"{self.folder}: checkpoint lacks tensor {name}")
        file, entry, data_start = self._where[name]
        dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise SummarizeError(f"{file}: tensor {name} has unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        raw = torch.empty(end - begin, dtype=torch.uint8)  # filled in place: one copy, no memset, no numpy
        if end > begin:
            with open(file, "rb") as f:
                f.seek(data_start + begin)
                if f.readinto(bytes_of(raw)) != end - begin:
                    raise SummarizeError(f"{file}: truncated; tensor {name} is incomplete")
        return raw.view(dtype).reshape(entry["shape"])


def _read_header(file: Path) -> tuple[dict, int]:
    """A safetensors file's header (its JSON object) and where its data starts, checked against
    the file's size before anything of that size is read."""
    try:
        with open(file, "rb") as f:
            length = int.from_bytes(f.read(HEADER_LENGTH_BYTES), "little")
            file_bytes = os.fstat(f.fileno()).st_size
            if file_bytes < HEADER_LENGTH_BYTES:
                raise SummarizeError(f"{file}: not a safetensors file ({file_bytes} bytes)")
            if length > min(MAX_HEADER_BYTES, file_bytes - HEADER_LENGTH_BYTES):
                raise SummarizeError(
                    f"{file}: not a safetensors file (its header claims {length:,} bytes; the file has {file_bytes:,})"
                )
            header = json.loads(f.read(length))
    except OSError as exc:
        raise SummarizeError(f"{file}: cannot be read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep
        raise SummarizeError(f"{file}: not a safetensors file ({type(exc).__name__}: header is not JSON)") from None
    if not isinstance(header, dict):
        raise SummarizeError(f"{file}: not a safetensors file (its header is not a JSON object)")
    return header, HEADER_LENGTH_BYTES + length


def _check_entry(file: Path, name: str, entry, data_bytes: int) -> None:
    """One header entry: a known layout, and bytes that lie inside the file and fit its shape."""
    if not isinstance(entry, dict):
        raise SummarizeError(f"{file}: not a safetensors file (the entry of {name} is not an object)")
    shape, offsets, dtype_name = entry.get("shape"), entry.get("data_offsets"), entry.get("dtype")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise SummarizeError(f"{file}: tensor {name} has no valid shape ({shape!r})")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise SummarizeError(f"{file}: tensor {name} has no valid data_offsets ({offsets!r})")
    if not isinstance(dtype_name, str):
        raise SummarizeError(f"{file}: tensor {name} has no valid dtype ({dtype_name!r})")
    if offsets[1] > data_bytes:
        raise SummarizeError(
            f"{file}: truncated or corrupt; tensor {name} ends at byte {offsets[1]:,} of data, the file holds {data_bytes:,}"
        )
    dtype = SAFETENSORS_DTYPES.get(dtype_name)  # an unknown dtype is said if the tensor is ever read
    if dtype is not None and offsets[1] - offsets[0] != math.prod(shape) * dtype.itemsize:
        raise SummarizeError(
            f"{file}: tensor {name} has {offsets[1] - offsets[0]:,} bytes; {dtype_name} {tuple(shape)} needs "
            f"{math.prod(shape) * dtype.itemsize:,}"
        )


class TorchCheckpoint:
    """The tensors of a `.pth` file (a BlinkDL RWKV checkpoint), memory-mapped, same surface as Checkpoint."""

    def __init__(self, path: Path) -> None:
        self.folder = path  # named in messages
        try:
            tensors = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError:  # torch's advice (weights_only=False) would run the file's code
            raise SummarizeError(f"{path}: not a readable PyTorch checkpoint (it holds code or objects other than "
                                 "tensors, which summarize will not run)") from None
        except Exception as exc:  # not a zip checkpoint, truncated file
            raise SummarizeError(f"{path}: not a readable PyTorch checkpoint ({first_line(exc)})") from None
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


def load_model(
    source: str | os.PathLike,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    *,
    compile: bool | None = None,
    quantize: str | None = None,
    announce: Callable[[str | None], None] | None = None,
):
    """Load a recurrent-state model from a local folder, a hub id or a family's weight file (an
    RWKV-6 or RWKV-7 `.pth`); see docs/design.md §5.

    `compile`: run prefill and decode steps through torch.compile (`compiled`); None decides by the
    environment (SUMMARIZE_COMPILE) and the model's size. `quantize`: weight-only "int8" (one scale
    per row) or "int4" (a scale and a zero per 64 input channels; CPU only), where the family
    supports it; "auto": the forms this machine's calibration found fastest (`auto_forms`): an int4
    copy to generate tokens with, the weights stored as int8 for reading with int8 activations,
    either, both or neither; None: the weights as loaded. `announce` hears what is being compiled
    while it is (`CompiledSteps.announce`).
    """
    bound_kernel_caches()  # before the first kernel is built: memory that stays flat over chunks
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cpu":
        flush_denormals_to_zero()
    if quantize not in QUANTIZE_MODES:
        raise SummarizeError(f"unknown quantization {quantize!r} (supported: {', '.join(QUANTIZE_MODES[1:])})")
    copies = quantize == "auto"
    quantize = None if copies else quantize
    if quantize == "int4" and device.type != "cpu":
        raise SummarizeError(f"--quantize int4 runs on the CPU (torch's int4 kernel); on {device.type} use int8")
    dtype = dtype or default_dtype(device)
    path = Path(source).expanduser()
    file_families = [] if is_ollama_name(source) else families_for_file(path.suffix)  # ollama:x.pth is Ollama's
    if file_families:
        if not path.is_file():
            raise ModelNotAvailable(f"{source}: no such checkpoint file")
        _check_quantize(file_families, quantize, dtype)  # said before opening a multi-gigabyte file
        checkpoint = TorchCheckpoint(path)  # memory-mapped: its names are read, no tensor yet
        family = family_for_checkpoint(file_families, checkpoint)
        _check_quantize([family], quantize, dtype)
        model = family.build({}, checkpoint, device=device, dtype=dtype, quantize=quantize)
        model.source = path.parent
    elif (gguf := gguf_file_for(source)) is not None:
        model = _load_gguf(gguf, device, dtype, quantize)
    else:
        folder = resolve_source(source)
        config = read_config(folder)
        model_type = config.get("model_type") or (config.get("text_config") or {}).get("model_type")
        family = family_for_model_type(model_type)
        if family is None:
            raise SummarizeError(f"{folder}: unsupported model_type {model_type!r} (supported: {', '.join(supported_model_types())})")
        _check_quantize([family], quantize, dtype)
        model = family.build(config, Checkpoint(folder), device=device, dtype=dtype, quantize=quantize)
        model.source = folder
    release_free_memory()  # what loading (and quantizing) freed goes back to the OS
    weight_bytes = sum(b.nbytes for b in model.buffers())
    compiles = compile if compile is not None else wanted(model, device, weight_bytes)
    if compiles:
        prepare_compiler()  # before the calibration compiles its candidates, as the steps will be
    if device.type == "cpu":
        # before any step is compiled: the graphs follow the policy; without a working compiler, none is
        compiles = calibrate_model(model, dtype, announce, compiles)
        release_free_memory()  # what a calibration held (its weights to time) goes back to the OS
        if copies:
            auto_forms(model, copy=bool(machine.POLICY.int4_copy_generates), int8=bool(machine.POLICY.int8_activations))
    if compiles:
        compile_steps(model, announce)
    return model


def auto_forms(model, copy: bool, int8: bool) -> None:
    """quantize="auto"'s forms of `model`'s full-precision projections, one projection at a time so
    that memory grows by one projection at most: with `copy`, an int4 copy to generate tokens with
    (`Projection.add_int4_copy`; not for a table read only by row), made from the weight before
    `int8` stores it as int8 for reading (`linear.int8_activations`), prepacked where the policy says
    so and a copy generates (`Projection.prepack_int8`; a head also read by row keeps its plain
    rows beside). Copies that would take more
    than half the available memory, net of what int8 frees, are not made (said in
    `model.load_notes`). Sets `model.int4_copy_bytes` and `model.reads_int8`."""
    lookups = {id(table) for table in model.lookup_tables()}  # read by row: a copy would never be read
    read_by_row = {id(table) for table in model.row_tables()}  # a prepacked one keeps its plain rows too
    full = [p for p in model.modules() if isinstance(p, Projection) and p.scale is None and p.scale_and_zero is None]
    copied = {id(p) for p in full if id(p) not in lookups and int4_takes(p.weight.shape, INT4_GROUP, p.weight.device)}
    # codes, and a bf16 scale and zero per group; int8 keeps a byte a weight (and a scale a row)
    needed = sum(p.weight.numel() // 2 + p.weight.numel() // INT4_GROUP * 4 for p in full if id(p) in copied) if copy else 0
    freed = sum(p.weight.nbytes - p.weight.numel() for p in full) if int8 else 0
    available = available_bytes()
    if needed and available is not None and needed - freed > COPY_MAX_SHARE_OF_AVAILABLE * available:
        model.load_notes.append(f"no int4 copy to generate with: it needs {needed / 2**30:.1f} GiB, "
                                f"{available / 2**30:.1f} GiB is available")
        needed = 0
    prepack = int8 and bool(machine.POLICY.int8_prepacked)
    for projection in full:
        if needed and id(projection) in copied:
            projection.add_int4_copy()
        if int8:
            projection.quantize_int8()
        if prepack and needed and id(projection) in copied:  # without a copy, one row reads torch's int8 kernel
            projection.prepack_int8(keep_rows=id(projection) in read_by_row)
    model.int4_copy_bytes, model.reads_int8 = needed, int8
    release_free_memory()  # the replaced weights, and the packing's temporaries


def _load_gguf(path: Path, device: torch.device, dtype: torch.dtype, quantize: str | None):
    """A model from a GGUF file: config, weights (and, later, the tokenizer) all from the file.

    Its projections keep the file's own codes and group scales where a kernel takes them (int4 on
    the CPU; int8 groups); what had to be widened to `dtype` is said in `model.load_notes`."""
    file = GGUFFile(path, int4=device.type == "cpu")
    family = family_for_gguf_arch(file.architecture)
    if family is None:
        raise SummarizeError(f"{path}: architecture {file.architecture!r} is not supported "
                             f"(supported: {', '.join(supported_gguf_archs())})")
    _check_quantize([family], quantize, dtype)
    config, checkpoint = family.read_gguf(file, dtype)
    model = family.build(config, checkpoint, device=device, dtype=dtype, quantize=quantize)
    model.source = path
    model.load_notes = [note for note in [file.widening_note()] if note]
    return model


def _check_quantize(families: list[Family], quantize: str | None, dtype: torch.dtype) -> None:
    """Refuse `quantize` unless one of `families` (those the checkpoint may be) accepts it."""
    if quantize and not any(quantize in family.quantize_modes for family in families):
        able = ", ".join(f.label for f in FAMILIES if quantize in f.quantize_modes)
        which = " or ".join(family.label for family in families)
        raise SummarizeError(f"--quantize {quantize} is for {able} models; {which} runs in {str(dtype).removeprefix('torch.')}")


def flush_denormals_to_zero() -> None:
    """Let the CPU treat values below fp32's smallest normal (1.2e-38) as zero (FTZ and DAZ).

    The chunked delta rule multiplies by decays that pass through that range whenever a head
    forgets fast, and subnormal arithmetic runs many times slower on many x86 CPUs. The mode is per
    thread, and torch's worker threads copy it from the main thread at the process's first parallel
    op: hence its place before loading the weights.
    """
    torch.set_flush_denormal(True)


def load_tokenizer(model):
    """The tokenizer that goes with a loaded model, and the token ids that end its answers."""
    source = Path(model.source)
    if source.is_file():  # a GGUF file (an Ollama blob has no suffix), which carries its own; others' are folders
        return load_gguf_tokenizer(GGUFFile(source))
    return family_named(model.family).load_tokenizer(source)

"""What the RWKV families (`rwkv6.py`, `rwkv7.py`) share: reading BlinkDL's checkpoints, the norms
and the token shift of their blocks, and the model around the blocks.

Conventions fixed here, once, at load time:
- Canonical tensor names are BlinkDL's (`blocks.N.att.*`); a Hugging Face layout is read through a
  family's name table, `locate(name) -> (stored name, transposed)`.
- BlinkDL stores per-channel vectors as [1, 1, C]; they are read as [C].
- `blocks.0.ln0` is folded into the embedding (a LayerNorm of each row): the model never runs it.
- Time-mix receives ln1(x), channel-mix ln2(x); what they keep as "previous token" is that input.

State per layer: `RecurrentLayerState(matrix=[B, H, N, N] fp32 (key rows, value columns),
shift=[B, 2, C])`, shift[:, 0] the time-mix's previous input, shift[:, 1] the channel-mix's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from summarize.engine.model import RecurrentModel
from summarize.engine.ops.linear import Projection, quantized
from summarize.engine.state import RecurrentLayerState, State
from summarize.errors import SummarizeError

LAYER_NORM_EPS = 1e-5
GROUP_NORM_EPS = 64e-5  # BlinkDL's ln_x: 1e-5 * head_size_divisor**2, divisor 8
EMBED_FOLD_ROWS = 8192  # ln0 is folded into the embedding this many rows at a time (bounded fp32 copy)

# BlinkDL's architecture versions, told apart by a tensor name of block 0's time-mix (as the `rwkv`
# package tells them apart), first match wins: RWKV-5's `ln_x` is also in RWKV-6 and RWKV-7 files.
VERSION_MARKS = (
    ("x070", "RWKV-7 (x070)", ("blocks.0.att.r_k", "blocks.0.att.x_r")),
    ("x060", "RWKV-6 (x060)", ("blocks.0.att.time_maa_x",)),
    ("x050", "RWKV-5", ("blocks.0.att.ln_x.weight",)),
    ("x040", "RWKV-4", ("blocks.0.att.time_mix_k",)),
)
READ_VERSIONS = ("x060", "x070")  # the versions some family of this engine reads


def blinkdl_version(names: Collection[str]) -> str | None:
    """The RWKV version of a checkpoint in BlinkDL's names ("x060", ...), or None if it is none of them."""
    return next((version for version, _, marks in VERSION_MARKS if any(mark in names for mark in marks)), None)


def version_label(version: str | None) -> str:
    return next((label for v, label, _ in VERSION_MARKS if v == version), "not an RWKV checkpoint in BlinkDL's layout")


def require_version(checkpoint, version: str) -> None:
    """Raise the one-line SummarizeError that names what a BlinkDL checkpoint is, unless it is `version`."""
    found = blinkdl_version(set(checkpoint.names()))
    if found != version:
        readable = " and ".join(version_label(v) for v in READ_VERSIONS)
        what = f"an {version_label(found)} checkpoint" if found else version_label(found)
        raise SummarizeError(f"{checkpoint.folder}: {what}; summarize reads {readable}")


class Checkpoint(Protocol):
    folder: object

    def __contains__(self, name: str) -> bool: ...
    def names(self) -> list[str]: ...
    def shape(self, name: str) -> tuple[int, ...]: ...
    def read(self, name: str) -> Tensor: ...


Locate = Callable[[str], tuple[str, bool]]  # BlinkDL name -> (stored name, transposed there)
Take = Callable[..., Tensor]  # take(BlinkDL name, target=dtype) -> tensor, shape-checked, on the device


class SizingShapes:
    """A config's sizes read from tensor shapes (BlinkDL names) and its eps values from config.json,
    each failure one SummarizeError naming `where` (the checkpoint's folder or file)."""

    def __init__(self, shape: Callable[[str], tuple[int, ...] | None], config: dict, where: str, version: str) -> None:
        if not isinstance(config, dict):
            raise SummarizeError(f"{where}/config.json: not a JSON object of settings (a {type(config).__name__})")
        self.shape, self.config, self.where, self.version = shape, config, where, version

    def dims(self, name: str, rank: int) -> tuple[int, ...]:
        found = self.shape(name)
        if found is None:
            raise SummarizeError(f"{self.where}: checkpoint lacks tensor {name}; not an {version_label(self.version)} checkpoint")
        if len(found) != rank or not all(found):
            raise SummarizeError(f"{self.where}: tensor {name} has shape {tuple(found)}, expected {rank} non-zero sizes")
        return found

    def layers(self) -> int:
        count = 0
        while self.shape(f"blocks.{count}.ln1.weight") is not None:
            count += 1
        return count

    def setting(self, key: str, default: float) -> float:
        """config.json's `key`, a positive number, or `default` when absent."""
        value = self.config.get(key)
        if value is None:
            return default
        if type(value) not in (int, float) or not value > 0:
            raise SummarizeError(f"{self.where}/config.json: {key} must be a positive number, not {value!r}")
        return value


def blinkdl_name(name: str) -> tuple[str, bool]:
    """BlinkDL's names are the canonical ones."""
    return name, False


class NamedTensors:
    """A checkpoint read by BlinkDL names, each tensor checked against the table of shapes the
    model expects (`expect`), converted to the device and dtype, and remembered as used."""

    def __init__(self, checkpoint: Checkpoint, locate: Locate, *, device: torch.device, dtype: torch.dtype) -> None:
        self.checkpoint, self.locate, self.device, self.dtype = checkpoint, locate, device, dtype
        self.folder = checkpoint.folder
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.used: set[str] = set()

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The tensor's shape from the file's header (no tensor is read), or None if it is absent."""
        stored, transposed = self.locate(name)
        if stored not in self.checkpoint:
            return None
        dims = tuple(self.checkpoint.shape(stored))
        return dims[::-1] if transposed else dims

    def expect(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """The model's table: every tensor it reads, with its shape."""
        self.shapes = shapes

    def take(self, name: str, *, target: torch.dtype | None = None, convert: bool = True) -> Tensor:
        """The tensor, shape-checked, on the target device in `target` (default: the model's dtype);
        with convert=False as stored (it may map the file: never write into it)."""
        stored, transposed = self.locate(name)
        expected = self.shapes[name]
        if stored not in self.checkpoint:
            raise SummarizeError(f"{self.folder}: checkpoint lacks tensor {stored}")
        tensor = self.checkpoint.read(stored)
        tensor = tensor.t() if transposed else tensor
        # BlinkDL stores vectors as [1, 1, C]: compare without the size-1 dims
        if tuple(d for d in tensor.shape if d != 1) != tuple(d for d in expected if d != 1):
            raise SummarizeError(f"{self.folder}: tensor {stored} has shape {tuple(tensor.shape)}, expected {expected}")
        self.used.add(stored)
        tensor = tensor.reshape(expected)
        return tensor.to(device=self.device, dtype=target or self.dtype).contiguous() if convert else tensor

    def refuse_unknown(self, unused: Iterable[str], what: str) -> None:
        """Raise if the checkpoint holds tensors the model did not read beyond the known `unused`
        (BlinkDL names): a variant (`what` says which model does not have them) this engine does not implement."""
        ignored = {self.locate(name)[0] for name in unused}
        unknown = sorted(set(self.checkpoint.names()) - self.used - ignored)
        if unknown:
            raise SummarizeError(f"{self.folder}: tensors {what} does not have: {', '.join(unknown[:5])}")

    def embedding(self, eps: float) -> Tensor:
        """emb.weight with blocks.0.ln0 folded in when the checkpoint has it (a Hugging Face layout may not)."""
        if self.shape("blocks.0.ln0.weight") is None:
            return self.take("emb.weight")
        return fold_ln0(
            self.take("emb.weight", convert=False),
            weight=self.take("blocks.0.ln0.weight", target=torch.float32),
            bias=self.take("blocks.0.ln0.bias", target=torch.float32),
            dtype=self.dtype,
            eps=eps,
        )


def fold_ln0(emb: Tensor, *, weight: Tensor, bias: Tensor, dtype: torch.dtype, eps: float) -> Tensor:
    """The embedding [V, C] with blocks.0.ln0 applied to every row: computed in fp32 a block of rows
    at a time, written to a new tensor on weight's device in `dtype` (`emb` itself is never written)."""
    out = torch.empty(emb.shape, dtype=dtype, device=weight.device)
    for start in range(0, emb.shape[0], EMBED_FOLD_ROWS):
        rows = emb[start : start + EMBED_FOLD_ROWS].to(device=weight.device, dtype=torch.float32)
        out[start : start + EMBED_FOLD_ROWS] = F.layer_norm(rows, (emb.shape[1],), weight, bias, eps).to(dtype)
    return out


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """LayerNorm computed in fp32 (weight and bias are fp32), returned in x's dtype."""
    return F.layer_norm(x.float(), (x.shape[-1],), weight, bias, eps).to(x.dtype)


def token_shift(x: Tensor, state: RecurrentLayerState, slot: int) -> Tensor:
    """x [B, T, C] -> the previous token's x [B, T, C]; state.shift[:, slot] holds the one before
    x[:, 0], and moves on to x[:, -1]."""
    window = state.shift[:, slot : slot + 1]  # [B, 1, C]
    prev = torch.cat((window, x[:, :-1]), dim=1)
    state.slide(window, x)
    return prev


class RWKVModel(RecurrentModel):
    """An RWKV model: embedding (ln0 folded in), blocks, ln_out and head; every layer recurrent.

    `cfg` has hidden_size, num_layers, num_heads and head_size; `out_norm_eps` is ln_out's eps.
    """

    prefill_block_tokens = 2048  # prefill runs in blocks of at most this many tokens: bounded activations

    def __init__(
        self, cfg, take: Take, embedding: Tensor, blocks: Iterable[nn.Module], out_norm_eps: float, quantize: str | None = None
    ) -> None:
        super().__init__()
        self.cfg, self.out_norm_eps = cfg, out_norm_eps
        # quantized block by block (`blocks` builds them lazily): peak memory is the quantized model plus one block
        self.embedding = quantized(Projection(embedding), quantize)  # ln0 already applied to every row
        self.layers = nn.ModuleList(quantized(block, quantize) for block in blocks)
        self.register_buffer("ln_out_weight", take("ln_out.weight", target=torch.float32))
        self.register_buffer("ln_out_bias", take("ln_out.bias", target=torch.float32))
        self.head = quantized(Projection(take("head.weight")), quantize)

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.dtype

    def lookup_tables(self) -> list[nn.Module]:
        return [self.embedding]

    @property
    def device(self) -> torch.device:
        return self.ln_out_weight.device

    def new_state(self, batch_size: int = 1) -> State:
        cfg, dev = self.cfg, self.device
        H, N, C = cfg.num_heads, cfg.head_size, cfg.hidden_size
        return State(
            layers=[
                RecurrentLayerState(
                    matrix=torch.zeros(batch_size, H, N, N, dtype=torch.float32, device=dev),
                    shift=torch.zeros(batch_size, 2, C, dtype=self.dtype, device=dev),
                )
                for _ in range(cfg.num_layers)
            ]
        )

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.embedding.rows(input_ids)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.head(layer_norm(hidden, self.ln_out_weight, self.ln_out_bias, self.out_norm_eps))

"""The recurrent state of a model: one named object per layer, held together by `State`.

Layout (one documented layout for every family):
- `RecurrentLayerState`: the fixed-size memory of a recurrent layer. `matrix` is the delta-rule
  state [B, H, K, V] kept in fp32 whatever the weight dtype; `shift` is the short history the
  layer mixes in (Qwen3.5: the causal-conv window [B, C, kernel-1]; RWKV-7: token-shift vectors).
- `KVCache`: the keys/values of a full-attention layer, [B, H_kv, capacity, D] buffers of which
  the first `length` positions are valid. It grows in steps, so appending is not a copy per token.

A `Snapshot` is cheap: recurrent tensors are cloned, KV caches only remember their length (the
prefix is never overwritten), so restoring a KV cache is a truncation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from summarize.errors import SummarizeError

KV_GROWTH_TOKENS = 256  # a KV cache grows by at least this many positions at a time


@dataclass
class RecurrentLayerState:
    """State of one recurrent layer. matrix: [B, H, K, V] fp32; shift: [B, ...] model dtype."""

    matrix: torch.Tensor
    shift: torch.Tensor

    @property
    def nbytes(self) -> int:
        return _nbytes(self.matrix) + _nbytes(self.shift)

    bytes_per_token = 0  # fixed size: nothing grows with the context

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"matrix": self.matrix, "shift": self.shift}


@dataclass
class KVCache:
    """Keys and values of one attention layer: [B, H_kv, capacity, D], valid up to `length`."""

    keys: torch.Tensor
    values: torch.Tensor
    length: int = 0
    pad: torch.Tensor | None = None  # [B] positions at the start of each row that hold no token

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one cached position, keys and values, all rows of the batch."""
        return 2 * self.keys.shape[0] * self.keys.shape[1] * self.keys.shape[3] * self.keys.element_size()

    @property
    def nbytes(self) -> int:
        """Bytes of the valid positions (what the cache holds, not what it has reserved)."""
        return self.bytes_per_token * self.length

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write keys/values [B, H_kv, T, D] after the valid prefix; return all valid keys/values."""
        end = self.length + keys.shape[2]
        self.reserve(end)
        self.keys[:, :, self.length : end] = keys
        self.values[:, :, self.length : end] = values
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def reserve(self, needed: int) -> None:
        """Make room for `needed` positions. The buffers grow by an eighth (at least
        KV_GROWTH_TOKENS) so that appends are rarely copies, and new positions are zeros: a
        compiled decode step reads the whole buffer and masks what is not valid."""
        if needed <= self.capacity:
            return
        capacity = max(needed, self.capacity + max(KV_GROWTH_TOKENS, self.capacity // 8))
        capacity = -(-capacity // KV_GROWTH_TOKENS) * KV_GROWTH_TOKENS
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(old.shape[0], old.shape[1], capacity, old.shape[3])
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"keys": self.keys[:, :, : self.length], "values": self.values[:, :, : self.length]}

    def drop_middle(self, keep_first: int, keep_last: int) -> None:
        """Forget all but the first `keep_first` and the last `keep_last` positions."""
        if self.length <= keep_first + keep_last:
            return
        for buffer in (self.keys, self.values):
            buffer[:, :, keep_first : keep_first + keep_last] = buffer[:, :, self.length - keep_last : self.length].clone()
        self.length = keep_first + keep_last


LayerState = RecurrentLayerState | KVCache


@dataclass
class Snapshot:
    """A point to come back to: cloned recurrent tensors, KV prefixes by view, the position."""

    layers: list[dict[str, torch.Tensor] | tuple[torch.Tensor, torch.Tensor]]
    position: int


@dataclass
class State:
    """Everything a model carries from one token to the next, for a batch of sequences."""

    layers: list[LayerState]
    position: int = 0  # tokens consumed so far (the rotary position of the next token)
    row_positions: torch.Tensor | None = None  # [B] per-row positions when rows read different lengths

    @property
    def batch_size(self) -> int:
        first = self.layers[0]
        return (first.matrix if isinstance(first, RecurrentLayerState) else first.keys).shape[0]

    @property
    def nbytes(self) -> int:
        return self.recurrent_nbytes + self.kv_nbytes

    @property
    def recurrent_nbytes(self) -> int:
        """Bytes of the fixed-size recurrent memory: the same for 10 tokens and for 10 million."""
        return sum(layer.nbytes for layer in self.layers if isinstance(layer, RecurrentLayerState))

    @property
    def kv_nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers if isinstance(layer, KVCache))

    @property
    def bytes_per_token(self) -> int:
        """Bytes that one more cached token adds, for the whole batch (the attention layers' share)."""
        return sum(layer.bytes_per_token for layer in self.layers)

    @property
    def kv_tokens(self) -> int:
        return max((layer.length for layer in self.layers if isinstance(layer, KVCache)), default=0)

    @classmethod
    def stack(cls, states: list[State]) -> State:
        """One batch from batch-1 states that may have read different lengths (for batched decode).

        Recurrent tensors are concatenated; KV caches are right-aligned, the unused start of each
        row is marked as padding, and each row keeps its own rotary position. A single state is
        already a batch: it comes back as it is, without a copy, padding or per-row positions.
        """
        if len(states) == 1:
            return states[0]
        layers: list[LayerState] = []
        for per_row in zip(*(state.layers for state in states)):
            first = per_row[0]
            if isinstance(first, RecurrentLayerState):
                layers.append(RecurrentLayerState(
                    matrix=torch.cat([layer.matrix for layer in per_row]),
                    shift=torch.cat([layer.shift for layer in per_row]),
                ))
                continue
            longest = max(layer.length for layer in per_row)
            shape = (len(per_row), first.keys.shape[1], longest + KV_GROWTH_TOKENS, first.keys.shape[3])
            keys, values = first.keys.new_zeros(shape), first.values.new_zeros(shape)
            for row, layer in enumerate(per_row):
                keys[row, :, longest - layer.length : longest] = layer.keys[0, :, : layer.length]
                values[row, :, longest - layer.length : longest] = layer.values[0, :, : layer.length]
            pad = torch.tensor([longest - layer.length for layer in per_row], device=keys.device)
            layers.append(KVCache(keys=keys, values=values, length=longest, pad=pad))
        positions = [state.position for state in states]
        row_positions = torch.tensor(positions, device=states[0]._device())
        return cls(layers=layers, position=max(positions), row_positions=row_positions)

    def snapshot(self) -> Snapshot:
        saved = []
        for layer in self.layers:
            if isinstance(layer, RecurrentLayerState):
                saved.append({k: t.clone() for k, t in layer.tensors().items()})
            else:
                saved.append((layer.keys[:, :, : layer.length], layer.values[:, :, : layer.length]))
        return Snapshot(layers=saved, position=self.position)

    def restore(self, snapshot: Snapshot) -> None:
        """Come back to `snapshot`. A snapshot of batch 1 may be restored into any batch size."""
        if len(snapshot.layers) != len(self.layers):
            raise ValueError("snapshot belongs to a model with a different number of layers")
        for layer, saved in zip(self.layers, snapshot.layers):
            if isinstance(layer, RecurrentLayerState):
                layer.matrix.copy_(saved["matrix"].expand_as(layer.matrix))
                layer.shift.copy_(saved["shift"].expand_as(layer.shift))
            else:
                keys, values = saved
                length = keys.shape[2]
                same_storage = keys.data_ptr() == layer.keys.data_ptr() and keys.shape[0] == layer.keys.shape[0]
                if same_storage:
                    layer.length = length  # the prefix is still in place: a truncation
                else:
                    layer.length = 0
                    batch = layer.keys.shape[0]
                    shape = (batch, keys.shape[1], length, keys.shape[3])
                    layer.append(keys.expand(shape), values.expand(shape))
        self.position = snapshot.position

    def reset(self) -> None:
        for layer in self.layers:
            if isinstance(layer, RecurrentLayerState):
                layer.matrix.zero_()
                layer.shift.zero_()
            else:
                layer.length = 0
        self.position = 0

    def keep_attention_window(self, *, keep_first: int, keep_last: int) -> None:
        """Attention layers keep only the first and the last tokens, so their memory stays bounded.

        Used when a whole document streams through one state: the recurrent layers carry the long
        memory, the attention layers see the instruction and a recent window. Snapshots taken
        while more than keep_first + keep_last tokens were cached are no longer valid.
        """
        for layer in self.layers:
            if isinstance(layer, KVCache):
                layer.drop_middle(keep_first, keep_last)

    def save(self, path: str | Path) -> None:
        tensors: dict[str, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            for name, tensor in layer.tensors().items():
                tensors[f"layers.{i}.{name}"] = tensor.contiguous()
        save_file(tensors, str(path), metadata={"position": str(self.position)})

    def load(self, path: str | Path) -> None:
        """Load a state written by `save` into this one; the file must match these shapes."""
        try:
            with safe_open(str(path), framework="pt", device=str(self._device())) as f:
                position = int((f.metadata() or {}).get("position", "0"))
                tensors = {key: f.get_tensor(key) for key in f.keys()}
        except Exception as exc:  # safetensors raises several unrelated types for a bad file
            raise SummarizeError(f"{path}: not a saved state ({exc})") from exc
        expected = set()
        for i, layer in enumerate(self.layers):
            for name, tensor in layer.tensors().items():
                key = f"layers.{i}.{name}"
                expected.add(key)
                if key not in tensors:
                    raise SummarizeError(f"{path}: saved state lacks {key}; it belongs to another model")
                saved = tensors[key]
                if isinstance(layer, RecurrentLayerState):
                    if saved.shape != tensor.shape:
                        raise SummarizeError(
                            f"{path}: {key} has shape {tuple(saved.shape)}, this model needs {tuple(tensor.shape)}"
                        )
                elif saved.shape[:2] != tensor.shape[:2] or saved.shape[3] != tensor.shape[3]:
                    raise SummarizeError(f"{path}: {key} has shape {tuple(saved.shape)}; it belongs to another model")
        if set(tensors) - expected:
            raise SummarizeError(f"{path}: saved state has layers this model lacks; it belongs to another model")
        for i, layer in enumerate(self.layers):
            if isinstance(layer, RecurrentLayerState):
                layer.matrix.copy_(tensors[f"layers.{i}.matrix"])
                layer.shift.copy_(tensors[f"layers.{i}.shift"])
            else:
                layer.length = 0
                layer.append(tensors[f"layers.{i}.keys"].to(layer.keys.dtype), tensors[f"layers.{i}.values"].to(layer.values.dtype))
        self.position = position

    def _device(self) -> torch.device:
        first = self.layers[0]
        return (first.matrix if isinstance(first, RecurrentLayerState) else first.keys).device


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()

"""The recurrent state of a model: one object per layer that knows itself, held together by `State`.

Every layer state answers the same questions (snapshot/restore, stack, reset, tensors/load, nbytes,
bytes_per_token), so `State` never asks which kind a layer is:
- `RecurrentLayerState`: the fixed-size memory of a recurrent layer. `matrix` is the delta-rule
  state [B, H, K, V] kept in fp32 whatever the weight dtype; `shift` is the short history the
  layer mixes in (Qwen3.5: the causal-conv window [B, C, kernel-1]; RWKV-7: token-shift vectors).
- `KVCache`: the keys/values of a full-attention layer, [B, H_kv, capacity, D] buffers of which
  the first `length` positions are valid. It grows in steps, so appending is not a copy per token.

A snapshot is cheap: recurrent tensors are cloned, KV caches only remember their prefix by view
(it is never overwritten), so restoring a KV cache is a truncation.

A draft (docs/design.md §8): between `State.begin_draft` and `State.accept`, the model reads a span
of drafted tokens and the layer states change nothing; each recurrent layer keeps what lands it
after any prefix of the span (`Recurrence.verify`'s pending update, the span's shift rows), KV
caches keep the span's keys. `accept(counts)` lands row b after its first counts[b] tokens: one
update per recurrent tensor, a truncation per KV cache. No token is run twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol, runtime_checkable

import torch
from safetensors import safe_open

from summarize.engine.weights import safetensors_file
from summarize.errors import SummarizeError

KV_GROWTH_TOKENS = 256  # a KV cache grows by at least this many positions at a time


class Recurrence(NamedTuple):
    """The two ways a recurrent layer state runs its op over a span (keyword arguments, `state=`):
    `advance` updates the state in place and returns (o, stats or None); `verify` only reads it and
    returns (o, pending), where `pending.land(state, counts, with_stats)` applies a prefix."""

    advance: Callable
    verify: Callable


@dataclass
class RecurrentLayerState:
    """State of one recurrent layer. matrix: [B, H, K, V] fp32; shift: [B, ...] model dtype.

    Layers change it only through `run` (the matrix) and `slide` (the shift), which during a draft
    record what each prefix of the span would do instead.
    """

    matrix: torch.Tensor
    shift: torch.Tensor
    # during a draft: what lands each prefix, in the order the layer ran it
    pending: list | None = field(default=None, repr=False, compare=False)

    bytes_per_token = 0  # fixed size: nothing grows with the context
    cached_tokens = 0

    def run(self, recurrence: Recurrence, *, with_stats: bool, **inputs) -> tuple[torch.Tensor, object]:
        """The layer's op over a span from this state's matrix → (o, stats or None)."""
        if self.pending is None:
            return recurrence.advance(**inputs, state=self.matrix, with_stats=with_stats)
        o, update = recurrence.verify(**inputs, state=self.matrix)
        self.pending.append(update)
        return o, None

    def slide(self, window: torch.Tensor, new: torch.Tensor) -> None:
        """Make `window` (a view of `shift`, [B, W, C] time-major) the last W rows of [window | new]
        (new: [B, T, C], the span's rows)."""
        W, T = window.shape[1], new.shape[1]
        if self.pending is None:
            window.copy_(new[:, T - W :] if T >= W else torch.cat([window, new], dim=1)[:, T:])
        else:
            self.pending.append(_SlidWindow(window, torch.cat([window, new], dim=1)))

    def begin_draft(self) -> None:
        self.pending = []

    @property
    def drafting(self) -> bool:
        return self.pending is not None

    def discard(self) -> None:
        self.pending = None

    def accept(self, counts: torch.Tensor, with_stats: bool):
        """End the draft: row b lands after its first counts[b] tokens → the op's stats or None."""
        pending, self.pending = self.pending, None
        stats = None
        for update in pending:
            if isinstance(update, _SlidWindow):
                update.land(counts)
            else:
                stats = update.land(self.matrix, counts, with_stats)
        return stats

    @property
    def nbytes(self) -> int:
        return _nbytes(self.matrix) + _nbytes(self.shift)

    @property
    def batch_size(self) -> int:
        return self.matrix.shape[0]

    @property
    def device(self) -> torch.device:
        return self.matrix.device

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"matrix": self.matrix, "shift": self.shift}

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() for name, tensor in self.tensors().items()}

    def restore(self, saved: dict[str, torch.Tensor]) -> None:
        """Copy a snapshot back; one of batch 1 is broadcast over every row."""
        self.matrix.copy_(saved["matrix"].expand_as(self.matrix))
        self.shift.copy_(saved["shift"].expand_as(self.shift))

    @classmethod
    def stack(cls, rows: list[RecurrentLayerState]) -> RecurrentLayerState:
        return cls(matrix=torch.cat([row.matrix for row in rows]), shift=torch.cat([row.shift for row in rows]))

    def reset(self) -> None:
        self.matrix.zero_()
        self.shift.zero_()

    def keep_window(self, keep_first: int, keep_last: int) -> None:
        """Nothing to drop: a recurrent layer's memory does not grow."""

    def check(self, saved: dict[str, torch.Tensor], where: str) -> None:
        """Raise unless `saved` (what `tensors()` gave, read from `where`) fits this layer."""
        for name, tensor in self.tensors().items():
            if saved[name].shape != tensor.shape:
                raise SummarizeError(
                    f"{where}.{name} has shape {tuple(saved[name].shape)}, this model needs {tuple(tensor.shape)}"
                )

    def load(self, saved: dict[str, torch.Tensor]) -> None:
        self.restore(saved)


@dataclass
class _SlidWindow:
    """A shift window's move over a drafted span: window [B, W, C] and history [window | span]."""

    window: torch.Tensor
    history: torch.Tensor

    def land(self, counts: torch.Tensor) -> None:
        rows = counts[:, None] + torch.arange(self.window.shape[1], device=counts.device)  # [B, W]
        self.window.copy_(self.history.gather(1, rows[..., None].expand(-1, -1, self.history.shape[-1])))


@dataclass
class KVCache:
    """Keys and values of one attention layer: [B, H_kv, capacity, D], valid up to `length`.

    `hidden` [B, capacity] marks positions that hold no token of their row (the left padding of
    stacked rows, the rejected drafts of rows that accepted fewer than others): attention skips them.
    """

    keys: torch.Tensor
    values: torch.Tensor
    length: int = 0
    hidden: torch.Tensor | None = None
    draft_start: int | None = field(default=None, repr=False, compare=False)

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    @property
    def cached_tokens(self) -> int:
        return self.length

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one cached position, keys and values, all rows of the batch."""
        return 2 * self.keys.shape[0] * self.keys.shape[1] * self.keys.shape[3] * self.keys.element_size()

    @property
    def nbytes(self) -> int:
        """Bytes of the valid positions (what the cache holds, not what it has reserved)."""
        return self.bytes_per_token * self.length

    @property
    def batch_size(self) -> int:
        return self.keys.shape[0]

    @property
    def device(self) -> torch.device:
        return self.keys.device

    @property
    def hidden_keys(self) -> torch.Tensor | None:
        """[B, length] True where a valid position holds no token of its row; None if none do."""
        return None if self.hidden is None else self.hidden[:, : self.length]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write keys/values [B, H_kv, T, D] after the valid prefix; return all valid keys/values."""
        end = self.length + keys.shape[2]
        self.reserve(end)
        self.keys[:, :, self.length : end] = keys
        self.values[:, :, self.length : end] = values
        if self.hidden is not None:
            self.hidden[:, self.length : end] = False
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def begin_draft(self) -> None:
        self.draft_start = self.length

    @property
    def drafting(self) -> bool:
        return self.draft_start is not None

    def discard(self) -> None:
        self.length, self.draft_start = self.draft_start, None

    def accept(self, counts: torch.Tensor, with_stats: bool) -> None:
        """End the draft: the span's first max(counts) positions stay; in a row that accepted
        fewer, the rest are hidden."""
        start, self.draft_start = self.draft_start, None
        most = int(counts.max())
        self.length = start + most
        if int(counts.min()) < most:
            if self.hidden is None:
                self.hidden = torch.zeros(self.keys.shape[0], self.capacity, dtype=torch.bool, device=self.keys.device)
            span = torch.arange(most, device=counts.device)
            self.hidden[:, start : start + most] |= span >= counts[:, None]

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
        if self.hidden is not None:
            self.hidden = torch.nn.functional.pad(self.hidden, (0, capacity - self.hidden.shape[1]))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"keys": self.keys[:, :, : self.length], "values": self.values[:, :, : self.length]}

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

    def restore(self, saved: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Come back to a snapshot: a truncation while its prefix is still in these buffers, else a
        copy (one of batch 1 broadcast over every row)."""
        keys, values = saved
        length = keys.shape[2]
        if keys.data_ptr() == self.keys.data_ptr() and keys.shape[0] == self.keys.shape[0]:
            self.length = length
            return
        self.length = 0
        shape = (self.keys.shape[0], keys.shape[1], length, keys.shape[3])
        self.append(keys.expand(shape), values.expand(shape))

    @classmethod
    def stack(cls, rows: list[KVCache]) -> KVCache:
        """Rows of different lengths right-aligned in one cache; each row's unused start is padding."""
        first = rows[0]
        longest = max(row.length for row in rows)
        shape = (len(rows), first.keys.shape[1], longest + KV_GROWTH_TOKENS, first.keys.shape[3])
        keys, values = first.keys.new_zeros(shape), first.values.new_zeros(shape)
        hidden = torch.zeros(len(rows), shape[2], dtype=torch.bool, device=keys.device)
        for i, row in enumerate(rows):
            keys[i, :, longest - row.length : longest] = row.keys[0, :, : row.length]
            values[i, :, longest - row.length : longest] = row.values[0, :, : row.length]
            hidden[i, : longest - row.length] = True
        return cls(keys=keys, values=values, length=longest, hidden=hidden if hidden.any() else None)

    def reset(self) -> None:
        self.length = 0

    def keep_window(self, keep_first: int, keep_last: int) -> None:
        """Forget all but the first `keep_first` and the last `keep_last` positions."""
        if self.length <= keep_first + keep_last:
            return
        for buffer in (self.keys, self.values):
            buffer[:, :, keep_first : keep_first + keep_last] = buffer[:, :, self.length - keep_last : self.length].clone()
        if self.hidden is not None:
            self.hidden[:, keep_first : keep_first + keep_last] = self.hidden[:, self.length - keep_last : self.length].clone()
        self.length = keep_first + keep_last

    def check(self, saved: dict[str, torch.Tensor], where: str) -> None:
        """Raise unless `saved` (what `tensors()` gave, read from `where`) fits this layer; any length."""
        for name, tensor in self.tensors().items():
            got = saved[name]
            if got.shape[:2] != tensor.shape[:2] or got.shape[3] != tensor.shape[3]:
                raise SummarizeError(f"{where}.{name} has shape {tuple(got.shape)}; it belongs to another model")

    def load(self, saved: dict[str, torch.Tensor]) -> None:
        self.length = 0
        self.append(saved["keys"].to(self.keys.dtype), saved["values"].to(self.values.dtype))


@runtime_checkable
class LayerState(Protocol):
    """What `State`, the diagnostics and the compiled steps ask of any layer's state, whatever its
    kind: a new kind answers all of it (tests/test_layer_state.py checks each kind does)."""

    bytes_per_token: int  # bytes one more cached token adds, all rows (0: a fixed-size state)
    cached_tokens: int  # tokens held that grow with the context (0: a fixed-size state)

    @property
    def nbytes(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def drafting(self) -> bool: ...

    def begin_draft(self) -> None: ...
    def accept(self, counts: torch.Tensor, with_stats: bool): ...
    def discard(self) -> None: ...
    def snapshot(self): ...
    def restore(self, saved) -> None: ...
    @classmethod
    def stack(cls, rows: list): ...
    def reset(self) -> None: ...
    def keep_window(self, keep_first: int, keep_last: int) -> None: ...
    def tensors(self) -> dict[str, torch.Tensor]: ...
    def check(self, saved: dict[str, torch.Tensor], where: str) -> None: ...
    def load(self, saved: dict[str, torch.Tensor]) -> None: ...


@dataclass
class Snapshot:
    """A point to come back to: each layer's own snapshot, and the position."""

    layers: list
    position: int


@dataclass
class State:
    """Everything a model carries from one token to the next, for a batch of sequences."""

    layers: list[LayerState]
    position: int = 0  # tokens consumed so far (the rotary position of the next token)
    row_positions: torch.Tensor | None = None  # [B] per-row positions when rows read different lengths
    # the last layer's output [B, T, H] over the span last read (before the final norm), for
    # whatever reads hidden states (a drafting head); None until a span is read after a restore
    last_hidden: torch.Tensor | None = field(default=None, repr=False, compare=False)
    _draft_position: int = field(default=0, repr=False, compare=False)  # where the open draft began

    @property
    def batch_size(self) -> int:
        return self.layers[0].batch_size

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    @property
    def kv_nbytes(self) -> int:
        """Bytes of what grows with the context: the attention layers' cached tokens."""
        return sum(layer.bytes_per_token * layer.cached_tokens for layer in self.layers)

    @property
    def recurrent_nbytes(self) -> int:
        """Bytes of the fixed-size recurrent memory: the same for 10 tokens and for 10 million."""
        return self.nbytes - self.kv_nbytes

    @property
    def bytes_per_token(self) -> int:
        """Bytes that one more cached token adds, for the whole batch (the attention layers' share)."""
        return sum(layer.bytes_per_token for layer in self.layers)

    @property
    def kv_tokens(self) -> int:
        return max(layer.cached_tokens for layer in self.layers)

    def advance(self, tokens: int) -> None:
        """Count `tokens` more consumed, by every row."""
        self.position += tokens
        if self.row_positions is not None:
            self.row_positions += tokens

    def begin_draft(self) -> None:
        """Until `accept`, the model's next span is a draft: the layers change nothing, and keep
        what lands them after any prefix of it (see the module docstring)."""
        self._draft_position = self.position
        for layer in self.layers:
            layer.begin_draft()

    def accept(self, counts: torch.Tensor, with_stats: bool = False) -> list:
        """End the draft with row b after the first counts[b] tokens of the span ([B] int64,
        1 <= counts[b] <= the span's length) → per layer, the stats of the accepted tokens or None."""
        start = self._draft_position
        stats = [layer.accept(counts, with_stats) for layer in self.layers]
        if self.row_positions is None and int(counts.min()) < int(counts.max()):
            self.row_positions = torch.full_like(counts, self.position)
        if self.row_positions is not None:
            self.row_positions = self.row_positions - (self.position - start) + counts
        self.position = start + int(counts.max())
        return stats

    def discard(self) -> None:
        """End the draft keeping none of it: as it was at `begin_draft`."""
        for layer in self.layers:
            layer.discard()
        if self.row_positions is not None:
            self.row_positions = self.row_positions - (self.position - self._draft_position)
        self.position = self._draft_position

    @classmethod
    def stack(cls, states: list[State]) -> State:
        """One batch from batch-1 states that may have read different lengths (for batched decode).

        Each layer stacks its rows (KV caches right-aligned, their unused starts marked as padding),
        and each row keeps its own rotary position. A single state is already a batch: it comes back
        as it is, without a copy, padding or per-row positions.
        """
        if len(states) == 1:
            return states[0]
        layers = [type(rows[0]).stack(list(rows)) for rows in zip(*(state.layers for state in states))]
        positions = [state.position for state in states]
        row_positions = torch.tensor(positions, device=states[0].layers[0].device)
        return cls(layers=layers, position=max(positions), row_positions=row_positions)

    def snapshot(self) -> Snapshot:
        return Snapshot([layer.snapshot() for layer in self.layers], self.position)

    def restore(self, snapshot: Snapshot) -> None:
        """Come back to `snapshot`. A snapshot of batch 1 may be restored into any batch size."""
        if len(snapshot.layers) != len(self.layers):
            raise ValueError("snapshot belongs to a model with a different number of layers")
        for layer, saved in zip(self.layers, snapshot.layers):
            layer.restore(saved)
        self.position = snapshot.position
        self.last_hidden = None

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
        self.position = 0
        self.last_hidden = None

    def keep_attention_window(self, *, keep_first: int, keep_last: int) -> None:
        """Attention layers keep only the first and the last tokens, so their memory stays bounded.

        Used when a whole document streams through one state: the recurrent layers carry the long
        memory, the attention layers see the instruction and a recent window. Snapshots taken
        while more than keep_first + keep_last tokens were cached are no longer valid.
        """
        for layer in self.layers:
            layer.keep_window(keep_first, keep_last)

    def save(self, path: str | Path, metadata: dict[str, str] | None = None) -> None:
        """Write the state as a safetensors file; `metadata` goes into its header beside the position."""
        tensors: dict[str, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            for name, tensor in layer.tensors().items():
                tensors[f"layers.{i}.{name}"] = tensor.contiguous()
        safetensors_file.write(path, tensors, metadata=(metadata or {}) | {"position": str(self.position)})

    def load(self, path: str | Path) -> None:
        """Load a state written by `save` into this one; the file must match these shapes."""
        try:
            with safe_open(str(path), framework="pt", device=str(self.layers[0].device)) as f:
                position = int((f.metadata() or {}).get("position", "0"))
                tensors = {key: f.get_tensor(key) for key in f.keys()}
        except Exception as exc:  # safetensors raises several unrelated types for a bad file
            raise SummarizeError(f"{path}: not a saved state ({exc})") from exc
        per_layer = []
        for i, layer in enumerate(self.layers):
            keys = {name: f"layers.{i}.{name}" for name in layer.tensors()}
            missing = [key for key in keys.values() if key not in tensors]
            if missing:
                raise SummarizeError(f"{path}: saved state lacks {missing[0]}; it belongs to another model")
            per_layer.append({name: tensors.pop(key) for name, key in keys.items()})
        if tensors:
            raise SummarizeError(f"{path}: saved state has layers this model lacks; it belongs to another model")
        for i, (layer, saved) in enumerate(zip(self.layers, per_layer)):
            layer.check(saved, f"{path}: layers.{i}")
        for layer, saved in zip(self.layers, per_layer):  # nothing is changed until all of it fits
            layer.load(saved)
        self.position = position
        self.last_hidden = None


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()

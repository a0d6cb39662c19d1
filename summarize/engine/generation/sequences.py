"""The rows a generation reads into and writes from: the model's state, and beside it the memory
a drafter keeps of what the model read (the MTP head's cache), snapshotted, restored and stacked
together, so that the model's `State` carries nothing of any drafter; and the logits of each
row's next token once it has read its prompt. A caller that speaks token ids only `read`s rows
and hands them to `generate.generate_batch`, which stacks them: tensors stay in the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from summarize.engine.generation.drafter import DraftMemory
from summarize.engine.memory import release_free_memory
from summarize.engine.state import Snapshot, State


@dataclass
class SequencesSnapshot:
    state: Snapshot
    memory: object | None  # the drafter's memory's own snapshot, when it had one in step


@dataclass
class Sequences:
    """`state` (the model's, for a batch) and `memory`, the drafter's, None when it has none or when
    it fell out of step with the state (read without it, restored from a snapshot without it)."""

    state: State
    memory: DraftMemory | None = None
    # [B, V]: the logits of each row's next token, after a `read`; None until then, and after a restore
    logits: Tensor | None = field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        return self.state.batch_size

    @property
    def nbytes(self) -> int:
        return self.state.nbytes + (self.memory.nbytes if self.memory is not None else 0)

    @property
    def kv_nbytes(self) -> int:
        """Bytes of what grows with the context, the drafter's cache included."""
        return self.state.kv_nbytes + (self.memory.kv_nbytes if self.memory is not None else 0)

    @property
    def recurrent_nbytes(self) -> int:
        return self.nbytes - self.kv_nbytes

    @property
    def bytes_per_token(self) -> int:
        return self.state.bytes_per_token + (self.memory.bytes_per_token if self.memory is not None else 0)

    def prefill(self, model, input_ids: Tensor) -> Tensor:
        """`model.prefill` of input_ids [B, T] → logits [B, V]; the memory reads each block too."""
        if self.memory is None:
            return model.prefill(input_ids, self.state)
        in_step = [True]

        def read(tokens: Tensor, hidden: Tensor) -> None:
            if in_step[0]:
                in_step[0] = self.memory.read(model, self.state, tokens, hidden)

        logits = model.prefill(input_ids, self.state, read_hidden=read)
        if not in_step[0]:
            self.memory = None
        return logits

    def read(self, model, ids: list[int]) -> None:
        """Read the token ids `ids` into this batch-1 row (`prefill`), keeping the next token's logits;
        what the read freed goes back to the OS, so that memory stays flat chunk after chunk."""
        self.logits = self.prefill(model, torch.tensor([ids], dtype=torch.long, device=model.device))
        release_free_memory()

    def snapshot(self) -> SequencesSnapshot:
        return SequencesSnapshot(self.state.snapshot(), self.memory.snapshot() if self.memory is not None else None)

    def restore(self, snapshot: SequencesSnapshot) -> None:
        """Come back to `snapshot` (one of batch 1 into any batch size); a memory not in that
        snapshot has not read its positions, and is dropped."""
        self.state.restore(snapshot.state)
        self.logits = None
        if self.memory is not None and snapshot.memory is not None:
            self.memory.restore(snapshot.memory, self.batch_size)
        else:
            self.memory = None

    @classmethod
    def stack(cls, rows: list[Sequences]) -> Sequences:
        """One batch of `rows` (`State.stack`); the memories stack when every row has one in step."""
        if len(rows) == 1:
            return rows[0]
        memories = [row.memory for row in rows]
        memory = type(memories[0]).stack(memories) if all(m is not None for m in memories) else None
        logits = torch.cat([row.logits for row in rows]) if all(row.logits is not None for row in rows) else None
        return cls(State.stack([row.state for row in rows]), memory, logits)

    def reset(self) -> None:
        self.state.reset()
        self.logits = None
        if self.memory is not None:
            self.memory.reset()

    def keep_attention_window(self, *, keep_first: int, keep_last: int) -> None:
        """`State.keep_attention_window`; the drafter's memory no longer matches and is dropped."""
        self.state.keep_attention_window(keep_first=keep_first, keep_last=keep_last)
        self.memory = None

    def save(self, path: str | Path, metadata: dict[str, str] | None = None) -> None:
        """The model's state only (`State.save`): a drafter's memory is not saved."""
        self.state.save(path, metadata)

    def load(self, path: str | Path) -> None:
        self.state.load(path)
        self.memory = self.logits = None

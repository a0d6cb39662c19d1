"""What the speculative loop asks of a source of drafts, and of the memory a drafter keeps per row
(docs/design.md §8).

Two drafters answer it: `drafts.PromptLookups` (n-grams of the text itself) and
`mtp_drafts.MTPDrafts` (the checkpoint's multi-token-prediction head). A drafter that keeps a
memory of what the model read (the head's own KV cache, `DraftMemory`) keeps it beside the model's
state in `sequences.Sequences`, which snapshots, restores and stacks both together; the model's
`State` knows nothing of it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class Drafter(Protocol):
    """Drafts for every row of one generation. The loop tells it the first sampled token, then each
    step asks how long a draft each running row could have, takes drafts of the width the planner
    chose, and tells it what the model kept."""

    def start(self, token: Tensor) -> None:
        """After the prompt: the first sampled token of each row, token [B]."""

    def available(self, most: int, running: Collection[int]) -> list[int]:
        """Per row, the length of the draft it could offer (up to `most`; 0 for rows not running)."""

    def propose(self, width: int, running: Collection[int]) -> list[list[int]]:
        """Up to `width` drafted tokens per row ([] for rows not running)."""

    def landed(self, hidden: Tensor, following: Tensor, counts: Tensor) -> None:
        """The model kept counts[b] positions of row b's last span: the last layer's hidden states
        there, hidden [B, T, H], and the tokens that followed each, following[b, :counts[b]]."""


@runtime_checkable
class DraftMemory(Protocol):
    """A drafter's own memory of what the model read, for the rows of one state, kept in step by
    reading each prefill block's hidden states."""

    @property
    def nbytes(self) -> int: ...
    @property
    def kv_nbytes(self) -> int: ...
    @property
    def bytes_per_token(self) -> int: ...

    def read(self, model, state, tokens: Tensor, hidden: Tensor) -> bool:
        """After the model read `tokens` [B, T] into `state` with last-layer outputs `hidden`
        [B, T, H]: read them too → whether the memory is still in step with the state."""

    def snapshot(self): ...
    def restore(self, saved, batch_size: int) -> None: ...
    @classmethod
    def stack(cls, rows: list):
        """One memory for the rows' batch, or None when a row's cannot join it."""
    def reset(self) -> None: ...

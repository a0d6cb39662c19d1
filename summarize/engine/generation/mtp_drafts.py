"""Drafts from a checkpoint's multi-token-prediction head (Qwen3.5's `mtp.*`; docs/design.md §8).

The head guesses the token after next from the hidden state the model left at a position and the
token that followed it, attending over every earlier position it has read, through a KV cache of
its own (`HeadCache`), which rows made for drafting with it keep beside the model's state
(`sequences.Sequences`) and which reads each prefill block with the model (`HeadCache.read`): the
head reads the prompt as the model does, one position behind, so its cache covers the instruction
and the text, and a snapshot of the instruction restores it with the model's. Each step of a speculative loop it first reads what the
model landed since the last step (the hidden states of the kept tokens, with the tokens that
followed them); then it guesses up to k tokens ahead, feeding each guess back with its own output,
in a draft of that cache that is discarded afterwards. A state without the head's cache (loaded
from the read cache, say) drafts from a cache that starts at the prompt's last position.

Guessing a token needs the model's head, which at 0.8B is about a third of a decode step's
weight reads on a CPU. A summary copies its words from its source, so the head can be read only
for the tokens of the source and of the text so far (`vocabulary`): a draft outside it is never
made, and a draft is only a guess, so the output does not change.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from summarize.engine.state import Snapshot, State


@dataclass
class HeadCache:
    """The head's own memory for the rows of one model state (`drafter.DraftMemory`): its KV cache,
    and `waiting` [B, 1, H], the model's output at the last position read, waiting for the token
    that follows it (the head runs one position behind the model)."""

    state: State
    waiting: Tensor | None = None

    @classmethod
    def new(cls, model, batch_size: int) -> HeadCache:
        return cls(model.mtp.new_state(batch_size, model.dtype, model.device))

    @property
    def nbytes(self) -> int:
        return self.state.nbytes

    @property
    def kv_nbytes(self) -> int:
        return self.state.kv_nbytes

    @property
    def bytes_per_token(self) -> int:
        return self.state.bytes_per_token

    def read(self, model, state, tokens: Tensor, hidden: Tensor) -> bool:
        """The head reads each position of the block just read whose following token is now known;
        False when it is not in step with the model's state (that state read without it)."""
        head, waiting = self.state, self.waiting
        start = state.position - tokens.shape[1]
        if head.row_positions is not None or head.position + (waiting is not None) != start:
            return False
        if waiting is None:  # the first position of all: its hidden state pairs with the second token
            pairs, following = hidden[:, :-1], tokens[:, 1:]
        else:
            pairs, following = torch.cat([waiting, hidden[:, :-1]], dim=1), tokens
        if following.shape[1]:
            rotary = model.span_context(head, following.shape[1])
            model.mtp(model.embed(following), model.mtp.target_hidden(pairs), head, rotary, model.steps)
        self.waiting = hidden[:, -1:].clone()
        return True

    def snapshot(self) -> tuple[Snapshot, Tensor | None]:
        return self.state.snapshot(), self.waiting

    def restore(self, saved: tuple[Snapshot, Tensor | None], batch_size: int) -> None:
        snapshot, waiting = saved
        self.state.restore(snapshot)
        self.waiting = None if waiting is None else waiting.expand(batch_size, -1, -1)

    @classmethod
    def stack(cls, rows: list[HeadCache]) -> HeadCache | None:
        """None when a row has read nothing yet (nothing waits for its next token)."""
        if any(row.waiting is None for row in rows):
            return None
        return cls(State.stack([row.state for row in rows]), torch.cat([row.waiting for row in rows]))

    def reset(self) -> None:
        self.state.reset()
        self.waiting = None


class MTPDrafts:
    """Drafts for every row of a batch from `model.mtp` (a `drafter.Drafter`), kept in step with
    `state` (the model's): in `cache` when it has read the prompt with the model, else in a cache of
    its own from the prompt's last position."""

    def __init__(self, model, state, vocabulary: Iterable[int] | None = None, cache: HeadCache | None = None) -> None:
        self.model, self.head = model, model.mtp
        self.waiting: Tensor | None = None  # the hidden state [B, 1, H] whose following token `start` gives
        if cache is not None and cache.waiting is not None:
            self.state, self.waiting = cache.state, cache.waiting
            cache.waiting = None  # read from here on by this object, not by a prefill (a restore brings it back)
        else:
            self.state = self.head.new_state(state.batch_size, model.dtype, model.device)
            self.state.position = state.position
            if state.row_positions is not None:
                self.state.row_positions = state.row_positions.clone()
            if state.last_hidden is not None:
                self.state.position -= 1
                if self.state.row_positions is not None:
                    self.state.row_positions -= 1
                self.waiting = state.last_hidden[:, -1:]
        self.pending: tuple[Tensor, Tensor, Tensor] | None = None
        self.ids: Tensor | None = None  # the token ids the head is read for (None: all)
        self.rows: Tensor | None = None  # their rows of the head [S, H]
        if vocabulary is not None:
            self.ids = torch.tensor(sorted(set(vocabulary)), dtype=torch.long, device=model.device)
            self.rows = model.lm_head.rows(self.ids)

    def start(self, token: Tensor) -> None:
        """After a prefill: the model's last position, followed by the first sampled `token` [B]. A
        state that has not read a span since it was restored or stacked, and has no head state of
        its own, has nothing to give: the first draft then waits for the first decode step."""
        if self.waiting is not None:
            self.landed(self.waiting, token[:, None], torch.ones_like(token))

    def landed(self, hidden: Tensor, following: Tensor, counts: Tensor) -> None:
        """The model kept counts[b] tokens of row b's last span: their hidden states hidden[b, :n]
        ([B, T, H], the last layer's) and the tokens that followed them, following[b, :n]."""
        self.pending = (hidden, following, counts)

    def available(self, most: int, running: Collection[int]) -> list[int]:
        """The head can draft `most` for every running row (it drafts only what is verified)."""
        return [most if row in running else 0 for row in range(self.state.batch_size)]

    def propose(self, width: int, running: Collection[int] | None = None) -> list[list[int]]:
        """Up to `width` drafted tokens per running row ([] for every row before anything has landed).
        The head reads what landed whatever `width`: with 0 it only keeps its cache in step."""
        drafts = self._propose(width)
        return drafts if running is None else [d if row in running else [] for row, d in enumerate(drafts)]

    def _propose(self, most: int) -> list[list[int]]:
        batch = self.state.batch_size
        if self.pending is None:
            return [[] for _ in range(batch)]
        hidden, following, counts = self.pending
        self.pending = None
        # read what landed, as a draft of the head's cache that keeps counts[b] positions of row b
        self.state.begin_draft()
        out = self._run(following, self.head.target_hidden(hidden))
        self.state.accept(counts)
        if most <= 0:
            return [[] for _ in range(batch)]
        last = out.gather(1, (counts - 1)[:, None, None].expand(-1, 1, out.shape[-1]))  # [B, 1, H]
        guesses = [self._guess(last)]
        if most > 1:
            self.state.begin_draft()
            for _ in range(most - 1):
                last = self._run(guesses[-1], last)
                guesses.append(self._guess(last))
            self.state.discard()
        return torch.cat(guesses, dim=1).tolist()

    def _run(self, tokens: Tensor, hidden: Tensor) -> Tensor:
        rotary = self.model.span_context(self.state, tokens.shape[1])
        return self.head(self.model.embed(tokens), hidden, self.state, rotary)

    def _guess(self, out: Tensor) -> Tensor:
        """The head's output [B, 1, H] → its most likely token [B, 1]."""
        if self.rows is None:
            return self.model.lm_head(out).argmax(dim=-1)
        return self.ids[(out @ self.rows.T).argmax(dim=-1)]

"""Drafts from a checkpoint's multi-token-prediction head (Qwen3.5's `mtp.*`; docs/design.md §8).

The head guesses the token after next from the hidden state the model left at a position and the
token that followed it. Each step of a speculative loop it first reads what the model landed
since the last step (the hidden states of the kept tokens, with the tokens that followed them),
into a KV cache of its own that stays in step with the model's positions; then it guesses up to
k tokens ahead, feeding each guess back with its own output, in a draft of that cache that is
discarded afterwards.

Guessing a token needs the model's head, which at 0.8B is about a third of a decode step's
weight reads on a CPU. A summary copies its words from its source, so the head can be read only
for the tokens of the source and of the text so far (`vocabulary`): a draft outside it is never
made, and a draft is only a guess, so the output does not change.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


class MTPDrafts:
    """Drafts for every row of a batch from `model.mtp`, kept in step with `state` (the model's)."""

    def __init__(self, model, state, vocabulary: Iterable[int] | None = None) -> None:
        self.model, self.head = model, model.mtp
        batch = state.batch_size
        self.state = self.head.new_state(batch, model.dtype, model.device)
        self.state.position = state.position
        if state.row_positions is not None:
            self.state.row_positions = state.row_positions.clone()
        self.pending: tuple[Tensor, Tensor, Tensor] | None = None
        self.ids: Tensor | None = None  # the token ids the head is read for (None: all)
        self.rows: Tensor | None = None  # their rows of the head [S, H]
        if vocabulary is not None:
            self.ids = torch.tensor(sorted(set(vocabulary)), dtype=torch.long, device=model.device)
            self.rows = model.lm_head.rows(self.ids)

    def start(self, state, token: Tensor) -> None:
        """After a prefill: the model's last position, followed by the first sampled `token` [B]. A
        state that has not read a span since it was restored or stacked has nothing to give: the
        first draft then waits for the first decode step."""
        if state.last_hidden is not None:
            self.state.position -= 1
            if self.state.row_positions is not None:
                self.state.row_positions -= 1
            self.landed(state.last_hidden[:, -1:], token[:, None], torch.ones_like(token))

    def landed(self, hidden: Tensor, following: Tensor, counts: Tensor) -> None:
        """The model kept counts[b] tokens of row b's last span: their hidden states hidden[b, :n]
        ([B, T, H], the last layer's) and the tokens that followed them, following[b, :n]."""
        self.pending = (hidden, following, counts)

    def propose(self, most: int) -> list[list[int]]:
        """Up to `most` drafted tokens per row ([] for every row before anything has landed). The
        head reads what landed whatever `most`: with 0 it only keeps its cache in step."""
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

"""What every model family shares: the model protocol, and the steps a model runs its spans through.

A family supplies its layers (`nn.Module`s called as `layer(x, layer_state, context, with_stats)
-> (x, stats or None)`), `embed`, `span_context`, `logits`, `new_state` and a `build` function;
`RecurrentModel` does the rest:

    forward(input_ids [B, T], state) -> logits [B, T, vocab]      (advances state)
    prefill(input_ids [B, T], state) -> logits [B, vocab]         (last position only, in blocks)
    decode(token_ids [B], state)     -> logits [B, vocab]         (one step)
    verify(token_ids [B, T], state)  -> logits [B, T, vocab]      (a draft: state not yet advanced)
    accept(state, counts [B])                                     (row b advanced by counts[b] tokens)

Set `listener` to receive a `SpanReport` after each call (docs/design.md §4). The layers and the
head run through `steps`: `Steps` runs them as they are; `compiled.compile_steps` swaps in
compiled ones from the outside, and the model does not know which it has. decode and verify
generate tokens (`ops.linear.generating_tokens`): projections holding an int4 copy read it there
(for a batch of up to the policy's `int4_copy_max_batch` sequences).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from summarize.engine.diagnostics import LayerStats, Listener, Phase, merge_block_stats, report_span
from summarize.engine.ops.linear import generating_tokens
from summarize.engine.state import State


class Steps:
    """Runs a model's layers and head eagerly."""

    def layer(self, layer: nn.Module, x: Tensor, layer_state, context, with_stats: bool):
        """One layer over x [B, T, H]. A layer that reads a cache whose length changes every step
        (attention) sets `reads_cache` and is three steps besides its `forward`, which chains
        them: `before_cache(x, context) -> parts`, `read_cache(parts, layer_state) -> parts` (run
        eagerly by every `Steps`) and `after_cache(x, parts, with_stats) -> (x, stats)`."""
        return layer(x, layer_state, context, with_stats)

    def head(self, model: RecurrentModel, hidden: Tensor) -> Tensor:
        return model.logits(hidden)

    def decode(self, model: RecurrentModel, token_ids: Tensor, state: State, with_stats: bool):
        """One token per row through every layer and the head → (logits [B, V], per-layer stats)."""
        hidden, stats = model.run_layers(token_ids[:, None], state, with_stats)
        return self.head(model, hidden[:, -1]), stats

    def will_read(self, model: RecurrentModel, tokens: int) -> None:
        """Told before a prefill block of `tokens` is read (compiled steps may build graphs then)."""

    def verify(self, model: RecurrentModel, token_ids: Tensor, state: State) -> Tensor:
        """A drafted span [B, T] through every layer and the head → logits [B, T, V]; the state is
        left in a draft (`RecurrentModel.verify`). The head runs eagerly: T changes from step to step."""
        state.begin_draft()
        hidden, _ = model.run_layers(token_ids, state, with_stats=False)
        return model.logits(hidden)


class RecurrentModel(nn.Module):
    """The model protocol; a family's model subclasses it (see the module docstring)."""

    family: str  # the registry's name for the family
    prefill_block_tokens = 1024  # prefill runs in blocks of at most this many tokens: bounded activations
    compiles = False  # whether its steps may be compiled (`compiled.wanted`)
    layers: nn.ModuleList
    # where the weights were read from (a folder, a GGUF file): the tokenizer and the read cache's
    # identity are found from it; `loading.load_model` sets it, None for a model built in memory
    source: Path | None

    def __init__(self) -> None:
        super().__init__()
        self.listener: Listener | None = None
        self.steps = Steps()
        self.compiled = None  # the compiled steps, once `compiled.compile_steps` has set them
        self.load_notes: list[str] = []  # what loading wants said (a GGUF file's widened kinds)
        self.int4_copy_bytes = 0  # the int4 copies its projections generate tokens with (`loading.auto_forms`)
        self.reads_int8 = False  # quantize="auto" stored its weights as int8, read with int8 activations
        self.source = None

    # -- what a family supplies ----------------------------------------------------------------

    def new_state(self, batch_size: int = 1) -> State:
        raise NotImplementedError

    def embed(self, input_ids: Tensor) -> Tensor:
        """input_ids [B, T] → hidden states [B, T, H] in the model's dtype."""
        raise NotImplementedError

    def span_context(self, state: State, tokens: int):
        """What every layer needs for the next `tokens` tokens (rotary angles, say); None by default."""
        return None

    def logits(self, hidden: Tensor) -> Tensor:
        """The final norm and the head: hidden [..., H] → logits [..., V]."""
        raise NotImplementedError

    def lookup_tables(self) -> list[nn.Module]:
        """Its projections read only by row (an embedding that is not also the head)."""
        return []

    def row_tables(self) -> list[nn.Module]:
        """Its projections read by row at all: the lookups, an embedding that is also the head, a
        head whose rows a drafter reads."""
        return self.lookup_tables()

    @property
    def dtype(self) -> torch.dtype:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    # -- what every family gets -----------------------------------------------------------------

    @torch.no_grad()
    def forward(self, input_ids: Tensor, state: State) -> Tensor:
        hidden, stats = self.run_layers(input_ids, state, with_stats=True)
        self._report(stats, state, "prefill", input_ids.shape[1])
        return self.logits(hidden)

    @torch.no_grad()
    def prefill(self, input_ids: Tensor, state: State, read_hidden: Callable[[Tensor, Tensor], None] | None = None) -> Tensor:
        """`read_hidden(block [B, T], hidden [B, T, H])` is given each block's tokens and last-layer
        outputs as they are read, for what reads along with the model (a drafting head)."""
        # prefill always checks the state: cheap per block
        blocks: list[tuple[int, LayerStats]] = []
        for start in range(0, input_ids.shape[1], self.prefill_block_tokens):
            block = input_ids[:, start : start + self.prefill_block_tokens]
            self.steps.will_read(self, block.shape[1])
            hidden, stats = self.run_layers(block, state, with_stats=True)
            if read_hidden is not None:
                read_hidden(block, hidden)
            blocks.append((block.shape[1], stats))
        self._report(merge_block_stats(blocks), state, "prefill", input_ids.shape[1])
        return self.logits(hidden[:, -1])

    @torch.no_grad()
    def decode(self, token_ids: Tensor, state: State) -> Tensor:
        # decode measures the state only when someone listens
        with generating_tokens(token_ids.shape[0]):
            logits, stats = self.steps.decode(self, token_ids, state, self.listener is not None)
        self._report(stats, state, "decode", 1)
        return logits

    @torch.no_grad()
    def verify(self, token_ids: Tensor, state: State) -> Tensor:
        """The logits of every position [B, T, V] of a span of drafted tokens [B, T] (the last
        sampled token, then the drafts). The state is only read: `accept` then lands each row after
        the tokens it keeps, without running any of them again (docs/design.md §8)."""
        with generating_tokens(token_ids.shape[0]):
            return self.steps.verify(self, token_ids, state)

    @torch.no_grad()
    def accept(self, state: State, counts: Tensor, drafted: list[int] | None = None) -> None:
        """End `verify`'s draft: row b keeps its first counts[b] tokens ([B] int64, at least 1).
        The span is reported as those tokens only (with `drafted`, the drafts each row was offered)."""
        stats = state.accept(counts, with_stats=self.listener is not None)
        report_span(stats, state, "decode", counts.tolist(), self.listener, drafted)

    def run_layers(self, input_ids: Tensor, state: State, with_stats: bool) -> tuple[Tensor, LayerStats]:
        """Every layer over input_ids [B, T]: the last hidden states [B, T, H] and per-layer stats."""
        T = input_ids.shape[1]
        context = self.span_context(state, T)
        x = self.embed(input_ids)
        stats: LayerStats = []
        for layer, layer_state in zip(self.layers, state.layers):
            x, layer_stats = self.steps.layer(layer, x, layer_state, context, with_stats)
            stats.append(layer_stats)
        state.advance(T)
        state.last_hidden = x
        return x, stats

    def _report(self, stats: LayerStats | None, state: State, phase: Phase, tokens: int | list[int]) -> None:
        report_span(stats, state, phase, tokens, self.listener)

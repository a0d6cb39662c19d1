"""Token generation: sampling and the decode loops.

`generate_batch(model, state, GenerationRequest(...))` runs `plain_decode` or, when the request
asks for drafts, `speculative_decode` (model.verify / model.accept as well). The model is anything with
    prefill(input_ids: LongTensor [B, T], state) -> FloatTensor [B, V]   (last position's logits)
    decode(token_ids: LongTensor [B], state)     -> FloatTensor [B, V]   (one step)
both advancing `state` in place. Decoding is memory-bound, so the loop keeps per-token work
small: sampling is a handful of tensor ops (one top-k, softmax or argmax over the vocabulary), the
sampled ids stay on the device for the next step, and on CUDA the copy of the ids to the host
overlaps with the next decode step instead of waiting for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from summarize.engine.generation.drafter import Drafter
from summarize.engine.generation.drafts import DraftCosts, DraftPlanner, PromptLookups
from summarize.engine.generation.mtp_drafts import MTPDrafts
from summarize.engine.generation.sequences import Sequences
from summarize.engine.memory import release_free_memory
from summarize.engine.tokenizers.tokenizer import IncrementalDetokenizer, Tokenizer

# Candidates taken first when looking for the top-p nucleus on the CPU; most nuclei are smaller.
NUCLEUS_FIRST_K = 256


@dataclass
class SamplingParams:
    """`temperature` 0 means greedy (argmax); `top_k` 0 and `top_p` 1.0 switch those filters off.

    `presence_penalty` is subtracted from the logits of every token already generated in the
    sequence (additive, once per distinct token), before temperature and filtering.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Generation:
    """Generated tokens (a stop token is not included) and their text."""

    token_ids: list[int]
    text: str
    stop_reason: str  # "stop": a stop token came; "length": max_new_tokens reached
    draft_tokens: int = 0  # tokens drafted for verification (speculative decoding)
    accepted_tokens: int = 0  # of which the model's own choices agreed with


def greedy_token(logits: Tensor) -> Tensor:
    """The id of each row's largest logit [B, V] → [B], the first one on a tie, as argmax picks.

    `max` rather than `argmax`: on a CPU it is several times faster over bf16 logits.
    """
    return logits.max(dim=-1).indices


class _Sampler:
    """Picks the next token of each row from logits [B, V]; all work stays on the device."""

    def __init__(self, params: SamplingParams, batch: int, vocab: int,
                 device: torch.device, banned: Collection[int] = ()) -> None:
        self.params = params
        self.greedy = params.temperature == 0.0
        # ids never picked (an RWKV World model's end-of-text): their logits count as -inf
        self.banned = torch.tensor(sorted(banned), dtype=torch.long, device=device) if banned else None
        self.generator = None
        if params.seed is not None and not self.greedy:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(params.seed)
        # penalty[b, v] = presence_penalty once token v has been generated in row b.
        self.penalty = (torch.zeros(batch, vocab, device=device)
                        if params.presence_penalty != 0.0 else None)

    def __call__(self, logits: Tensor) -> Tensor:
        """logits [B, V] (any float dtype) → token ids [B] (int64, same device)."""
        token = self._pick(logits)
        if self.penalty is not None:
            self.penalty.scatter_(1, token[:, None], self.params.presence_penalty)
        return token

    def verify(self, logits: Tensor, drafts: Tensor, drafted: Tensor) -> tuple[Tensor, Tensor]:
        """The model's own choices at every position of a verified span, and how many drafts each
        row keeps.

        logits [B, T, V] of the span [last token, drafts]; drafts [B, T-1], of which row b
        proposed the first drafted[b]. Position i is sampled as plain decoding would, from
        the logits after the drafts before it; a draft is kept while it equals that choice, so
        the kept tokens and the choice after them are exactly what plain decoding gives, greedy,
        and are distributed as it, sampled (docs/design.md §8).

        Returns chosen [B, T] and kept [B] (0 <= kept[b] <= drafted[b]); row b's next tokens are
        drafts[b, :kept[b]], then chosen[b, kept[b]].
        """
        B, T, _ = logits.shape
        chosen = torch.zeros(B, T, dtype=torch.long, device=logits.device)
        kept = torch.zeros(B, dtype=torch.long, device=logits.device)
        open_ = torch.ones(B, dtype=torch.bool, device=logits.device)  # rows whose drafts all agreed so far
        for i in range(T):
            token = self._pick(logits[:, i])
            if self.penalty is not None:  # only the rows that will emit this token see it
                seen = self.penalty.gather(1, token[:, None])
                self.penalty.scatter_(1, token[:, None], torch.where(open_[:, None], self.params.presence_penalty, seen))
            chosen[:, i] = token
            if i == T - 1:
                break
            open_ &= (drafted > i) & (drafts[:, i] == token)
            kept += open_
            if not bool(open_.any()):
                break
        return chosen, kept

    def _pick(self, logits: Tensor) -> Tensor:
        if self.banned is not None:
            logits = logits.index_fill(-1, self.banned, float("-inf"))
        if self.penalty is not None:
            logits = logits.float() - self.penalty
        if self.greedy:
            return greedy_token(logits)
        return self._sample(logits.float())

    def _sample(self, scores: Tensor) -> Tensor:
        """logits [B, V] fp32 (penalised) → token ids [B]."""
        p = self.params
        candidates = None  # vocabulary ids of the columns of `probs`, when filtered
        if p.top_k > 0:
            # Scaling keeps the order, so the temperature applies to the k survivors only. As in
            # HF and vLLM, top-p then works on the renormalised top-k distribution.
            scores, candidates = torch.topk(scores, min(p.top_k, scores.shape[-1]), dim=-1)
            probs = torch.softmax(self._scaled(scores), dim=-1)
        else:
            probs = torch.softmax(self._scaled(scores), dim=-1)
            if p.top_p < 1.0:
                probs, candidates = _descending_head(probs, p.top_p)
        if p.top_p < 1.0:
            # Keep the smallest prefix of the sorted candidates whose mass reaches top_p.
            before = torch.cumsum(probs, dim=-1) - probs
            probs = probs.masked_fill(before >= p.top_p, 0.0)
        choice = self._draw(probs)
        if candidates is not None:
            choice = candidates.gather(-1, choice[:, None])[:, 0]
        return choice

    def _scaled(self, scores: Tensor) -> Tensor:
        t = self.params.temperature
        return scores if t == 1.0 else scores / t

    def _draw(self, weights: Tensor) -> Tensor:
        """One index per row of weights [B, N] (≥ 0, rows need not sum to 1), by inverse CDF.

        Cheaper on CPU than the exponential-race trick (one uniform per row instead of N
        exponentials), and like it free of host syncs. fp64 keeps tiny tail weights exact.
        """
        dtype = torch.float32 if weights.device.type == "mps" else torch.float64  # MPS: no fp64
        cdf = torch.cumsum(weights, dim=-1, dtype=dtype)
        u = torch.rand(cdf.shape[0], 1, generator=self.generator, device=cdf.device,
                       dtype=dtype) * cdf[:, -1:]
        index = torch.searchsorted(cdf, u, right=True)
        return index.clamp_(max=cdf.shape[-1] - 1)[:, 0]


def _descending_head(probs: Tensor, top_p: float) -> tuple[Tensor, Tensor]:
    """The largest probabilities of each row of probs [B, V], sorted descending, with their ids:
    at least enough of them to reach a mass of top_p.

    A full sort of the vocabulary is cheap on an accelerator but costs tens of milliseconds on
    the CPU, where a top-k that grows until it covers top_p is exact and much faster (the
    check is a host sync, which the CPU does not mind).
    """
    vocab = probs.shape[-1]
    if probs.device.type != "cpu":
        return torch.sort(probs, dim=-1, descending=True)
    k = min(NUCLEUS_FIRST_K, vocab)
    while True:
        head, ids = torch.topk(probs, k, dim=-1)
        if k == vocab or bool((head.sum(dim=-1) >= top_p).all()):
            return head, ids
        k = min(k * 8, vocab)


class _HostCopy:
    """Brings sampled ids [B] to the host; on CUDA asynchronously, so the caller can queue the
    next decode step before waiting for them."""

    def __init__(self, batch: int, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.buffer = torch.empty(batch, dtype=torch.long, pin_memory=True)
            self.event = torch.cuda.Event()

    def start(self, token: Tensor) -> None:
        self.token = token
        if self.cuda:
            self.buffer.copy_(token, non_blocking=True)
            self.event.record()

    def wait(self) -> list[int]:
        if self.cuda:
            self.event.synchronize()
            return self.buffer.tolist()
        return self.token.tolist()


def _model_device(model) -> torch.device:
    device = getattr(model, "device", None)
    if device is not None:
        return torch.device(device)
    if isinstance(model, torch.nn.Module):
        for param in model.parameters():
            return param.device
    return torch.device("cpu")


@dataclass(frozen=True)
class Speculation:
    """How drafts are made (docs/design.md §8): up to `most` tokens a step, verified in one pass
    (`model.verify` / `model.accept`): the same tokens as without, greedy, and the same
    distribution, sampled. From `drafter` (a `drafter.Drafter` made for these rows) when given;
    else from the checkpoint's multi-token-prediction head with `mtp` (`mtp_drafts.MTPDrafts`,
    read for the tokens of the request's contexts); else by prompt lookup in each row's context
    and what it generated. `costs` carries what verifying was measured to cost from one
    generation to the next."""

    most: int
    drafter: Drafter | None = None
    mtp: bool = False
    costs: DraftCosts | None = None


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate, for a batch of B rows that share one batched state.

    Either `prompts` (B prompts of equal length, prefilled here) or `first_logits` [B, V] (the
    state has already read the prompts) starts it. A row stops at one of `stop_ids`, at
    `max_new_tokens`, or as soon as its text contains one of `stop_texts` (a chat model opening
    the next round; its text is cut there). `banned_ids` are never sampled (an RWKV World model's
    end-of-text). `contexts[row]`: what drafts are looked up in (default: the prompt).
    `on_text(row, text)` receives each row's text as it completes. `overlap` (default: on CUDA)
    queues the next decode step before reading the sampled ids, which may cost one extra step at a
    stop. `speculation`: draft and verify (None: plain decoding).
    """

    tokenizer: Tokenizer
    max_new_tokens: int
    stop_ids: Collection[int] = frozenset()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompts: Sequence[Sequence[int]] | Tensor | None = None
    first_logits: Tensor | None = None
    contexts: Sequence[Sequence[int]] | None = None
    stop_texts: Collection[str] = ()
    banned_ids: Collection[int] = ()
    on_text: Callable[[int, str], None] | None = None
    overlap: bool | None = None
    speculation: Speculation | None = None


def generate_batch(model, state, request: GenerationRequest) -> list[Generation]:
    """Generate what `request` asks from `state` (the model's `State`; `Sequences`, the state with a
    drafter's memory beside it; or a list of `Sequences` that have each read their prompt, decoded
    together as one batch): plain decoding, or speculative when it asks for drafts. Rows that stop
    early keep being stepped with their last sampled token, and what they produce is ignored, so at
    the end `state` rows hold no meaningful continuation."""
    if isinstance(state, list):
        return _generate_rows(model, state, request)
    if request.speculation is not None and request.speculation.most > 0:
        return speculative_decode(model, state, request)
    return plain_decode(model, state, request)


def _generate_rows(model, rows: list[Sequences], request: GenerationRequest) -> list[Generation]:
    """Rows that read prompts of different lengths, decoded as one batch (`Sequences.stack`; decoding
    is memory-bound, so a batch costs about what one row does). The rows are spent: the batch holds
    the only copy of their states while it decodes, and what it freed goes back to the OS after."""
    batch = Sequences.stack(rows)
    rows.clear()
    try:
        return generate_batch(model, batch, request)
    finally:
        del batch
        release_free_memory()


def plain_decode(model, state, request: GenerationRequest) -> list[Generation]:
    """One decode step per token."""
    start = _Start.of(model, state, request)
    if start.rows.running:
        overlap = start.token.device.type == "cuda" if request.overlap is None else request.overlap
        _plain_loop(model, start.sequences.state, start.sample, start.rows, start.token, overlap)
    return start.rows.results()


def speculative_decode(model, state, request: GenerationRequest) -> list[Generation]:
    """Decode steps that verify drafted tokens (`GenerationRequest.speculation`)."""
    speculation = request.speculation
    start = _Start.of(model, state, request)
    if start.rows.running:
        sequences, drafter = start.sequences, speculation.drafter
        if speculation.mtp:
            if getattr(model, "mtp", None) is None:
                raise ValueError("this checkpoint has no multi-token-prediction head (mtp.*) to draft from")
            vocabulary = (t for context in start.contexts for t in context) if start.contexts is not None else None
            drafter = MTPDrafts(model, sequences.state, vocabulary, sequences.memory)
        elif drafter is None:
            drafter = PromptLookups.over(start.contexts if start.contexts is not None else [()] * start.token.shape[0])
        _speculative_loop(model, sequences.state, start.sample, start.rows, start.token, speculation.most, drafter, speculation.costs)
    return start.rows.results()


@dataclass
class _Start:
    """A generation after its prompt: the rows, the sampler and each row's first token."""

    sequences: Sequences
    rows: _Rows
    sample: _Sampler
    token: Tensor | None
    contexts: Sequence[Sequence[int]] | None

    @classmethod
    def of(cls, model, state, request: GenerationRequest) -> _Start:
        sequences = state if isinstance(state, Sequences) else Sequences(state)
        first_logits, contexts = request.first_logits, request.contexts
        if first_logits is None and request.prompts is None:
            first_logits = sequences.logits  # the rows have read their prompts
        if first_logits is None:
            if request.prompts is None:
                raise ValueError("give prompts or first_logits")
            try:
                input_ids = torch.as_tensor(request.prompts, dtype=torch.long)
            except ValueError as e:  # ragged: a recurrent state cannot be padded
                raise ValueError("prompts of different lengths: prefill them yourself and pass "
                                 "first_logits") from e
            if input_ids.ndim != 2 or input_ids.numel() == 0:
                raise ValueError("prompts must be a non-empty batch of non-empty prompts")
            first_logits = sequences.prefill(model, input_ids.to(_model_device(model)))
            if contexts is None:
                contexts = input_ids.tolist()
        batch, vocab = first_logits.shape
        rows = _Rows(batch, request)
        sample = _Sampler(request.sampling, batch, vocab, first_logits.device, request.banned_ids)
        return cls(sequences, rows, sample, sample(first_logits) if rows.running else None, contexts)


class _Rows:
    """The rows' generated tokens: which still run, why each stopped, their text as it completes."""

    def __init__(self, batch: int, request: GenerationRequest) -> None:
        self.tokenizer, self.stop_ids, self.max_new_tokens = request.tokenizer, frozenset(request.stop_ids), request.max_new_tokens
        self.on_text, self.stop_texts = request.on_text, request.stop_texts
        self.token_ids: list[list[int]] = [[] for _ in range(batch)]
        self.reasons = ["length"] * batch
        self.running = set(range(batch)) if self.max_new_tokens > 0 else set()
        wants_text = self.on_text is not None or self.stop_texts
        self.detok = [IncrementalDetokenizer(self.tokenizer) for _ in range(batch)] if wants_text else None
        self.tails = [""] * batch  # the end of each row's text, long enough to hold any stop text
        self.tail_chars = max((len(t) for t in self.stop_texts), default=0)
        self.drafted = [0] * batch
        self.accepted = [0] * batch

    def take(self, row: int, tid: int) -> bool:
        """Row `row` produced `tid`: keep it unless it stops the row. Whether the row runs on."""
        if row not in self.running:
            return False
        if tid in self.stop_ids:
            return self._stop(row, "stop")
        self.token_ids[row].append(tid)
        if self.detok is not None:
            piece = self.detok[row].push(tid)
            if piece and self.stop_texts:
                self.tails[row] = (self.tails[row] + piece)[-(self.tail_chars + len(piece)):]
                if any(stop in self.tails[row] for stop in self.stop_texts):
                    return self._stop(row, "stop")
            if piece and self.on_text:
                self.on_text(row, piece)
        if len(self.token_ids[row]) >= self.max_new_tokens:
            return self._stop(row, "length")
        return True

    def _stop(self, row: int, reason: str) -> bool:
        self.reasons[row] = reason
        self.running.discard(row)
        return False

    def results(self) -> list[Generation]:
        results = []
        for row, ids in enumerate(self.token_ids):
            text = self.tokenizer.decode(ids)
            for stop in self.stop_texts:
                text = text.split(stop, 1)[0]
            if self.on_text is not None:
                piece = self.detok[row].flush()
                if piece:
                    self.on_text(row, piece)
            results.append(Generation(ids, text, self.reasons[row], self.drafted[row], self.accepted[row]))
        return results


def _plain_loop(model, state, sample: _Sampler, rows: _Rows, token: Tensor, overlap: bool) -> None:
    """One decode step per token."""
    host = _HostCopy(token.shape[0], token.device)
    while True:
        host.start(token)
        last = all(len(rows.token_ids[row]) + 1 >= rows.max_new_tokens for row in rows.running)
        if overlap and not last:
            logits = model.decode(token, state)
        for row, tid in enumerate(host.wait()):
            rows.take(row, tid)
        if not rows.running:
            return
        if not overlap or last:
            logits = model.decode(token, state)
        token = sample(logits)


def _speculative_loop(model, state, sample: _Sampler, rows: _Rows, token: Tensor, most: int, drafter: Drafter,
                      costs: DraftCosts | None) -> None:
    """Each step: the drafter says how long a draft (up to `most`) each running row could have, the
    planner picks how many to verify, and one `verify` pass reads the last token and the drafts;
    each row keeps the drafts its own samples agree with, and `accept` lands the state there. With
    nothing worth verifying, a plain decode step. Every step's wall time (the drafting included)
    teaches the planner what verifying costs."""
    batch = token.shape[0]
    planner = DraftPlanner(most, batch, costs)
    drafter.start(token)
    timing = None  # (width of the step being timed, its start)
    while True:
        ids = token.tolist()  # waits for the step: its time ends here
        if timing is not None:
            width, started = timing
            seconds = time.perf_counter() - started
            if width:
                planner.costs.learn_verify(batch, width, seconds)
            else:
                planner.costs.learn_step(batch, seconds)
        for row, tid in enumerate(ids):
            rows.take(row, tid)
        if not rows.running:
            return
        started = time.perf_counter()
        width = planner.width(drafter.available(most, rows.running), len(rows.running))
        drafts = drafter.propose(width, rows.running)
        width = max(map(len, drafts), default=0)  # a head has nothing before it has read a position
        timing = (width, started)
        if width == 0:
            token = sample(model.decode(token, state))
            drafter.landed(_last_hidden(state), token[:, None], torch.ones_like(token))
            continue
        span = torch.tensor([[ids[row], *d, *[0] * (width - len(d))] for row, d in enumerate(drafts)], device=token.device)
        logits = model.verify(span, state)  # [B, width + 1, V]
        drafted = [len(d) for d in drafts]
        chosen, kept = sample.verify(logits, span[:, 1:], torch.tensor(drafted, device=token.device))
        model.accept(state, kept + 1, drafted)
        for row, n in enumerate(kept.tolist()):
            planner.learn_row(row, drafted[row], n)
            rows.drafted[row] += drafted[row]
            rows.accepted[row] += n
            for tid in drafts[row][:n]:
                rows.take(row, tid)
        token = chosen.gather(1, kept[:, None])[:, 0]
        # each kept position was followed by the next drafted token, the last by `token`
        following = torch.cat([span[:, 1:], span[:, :1]], dim=1).scatter(1, kept[:, None], token[:, None])
        drafter.landed(_last_hidden(state), following, kept + 1)


def _last_hidden(state) -> Tensor | None:
    """What the model's last span left in its last layer, for a drafter that reads it."""
    return getattr(state, "last_hidden", None)


def generate(model, state, request: GenerationRequest) -> Generation:
    """Generate one sequence (batch 1; `generate_batch`). `prompts` may be one prompt [T] and
    `first_logits` one row [V]; `contexts` stays a list of one context."""
    prompts, first_logits = request.prompts, request.first_logits
    if prompts is not None:
        prompts = torch.as_tensor(prompts, dtype=torch.long).reshape(1, -1)
    if first_logits is not None:
        first_logits = first_logits.reshape(1, -1)
    return generate_batch(model, state, replace(request, prompts=prompts, first_logits=first_logits))[0]

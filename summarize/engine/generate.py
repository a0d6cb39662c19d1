"""Token generation: sampling and the decode loop.

The model is anything with
    prefill(input_ids: LongTensor [B, T], state) -> FloatTensor [B, V]   (last position's logits)
    decode(token_ids: LongTensor [B], state)     -> FloatTensor [B, V]   (one step)
both advancing `state` in place. Decoding is memory-bound, so the loop keeps per-token work
small: sampling is a handful of tensor ops (one top-k, softmax or argmax over the vocabulary), the
sampled ids stay on the device for the next step, and on CUDA the copy of the ids to the host
overlaps with the next decode step instead of waiting for it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .tokenizer import IncrementalDetokenizer, Tokenizer

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


def greedy_token(logits: Tensor) -> Tensor:
    """The id of each row's largest logit [B, V] → [B], the first one on a tie, as argmax picks.

    `max` rather than `argmax`: on a CPU it is several times faster over bf16 logits.
    """
    return logits.max(dim=-1).indices


class _Sampler:
    """Picks the next token of each row from logits [B, V]; all work stays on the device."""

    def __init__(self, params: SamplingParams, batch: int, vocab: int,
                 device: torch.device) -> None:
        self.params = params
        self.greedy = params.temperature == 0.0
        self.generator = None
        if params.seed is not None and not self.greedy:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(params.seed)
        # penalty[b, v] = presence_penalty once token v has been generated in row b.
        self.penalty = (torch.zeros(batch, vocab, device=device)
                        if params.presence_penalty != 0.0 else None)

    def __call__(self, logits: Tensor) -> Tensor:
        """logits [B, V] (any float dtype) → token ids [B] (int64, same device)."""
        p = self.params
        if self.penalty is not None:
            logits = logits.float() - self.penalty
        if self.greedy:
            token = greedy_token(logits)
        else:
            token = self._sample(logits.float())
        if self.penalty is not None:
            self.penalty.scatter_(1, token[:, None], p.presence_penalty)
        return token

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


def generate_batch(
    model,
    prompts: Sequence[Sequence[int]] | Tensor | None,
    state,
    *,
    tokenizer: Tokenizer,
    stop_ids: Collection[int],
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    on_text: Callable[[int, str], None] | None = None,
    first_logits: Tensor | None = None,
    overlap: bool | None = None,
    stop_texts: Collection[str] = (),
) -> list[Generation]:
    """Generate for a batch of B sequences that share one batched `state`.

    Either `prompts` (B prompts of equal length, prefilled here) or `first_logits` [B, V] (the
    caller has already prefilled `state`; `prompts` may then be None) starts the loop. Rows that
    stop early keep being stepped with their last sampled token, and what they produce is
    ignored, so at the end `state` rows hold no meaningful continuation. `on_text(row, text)`
    receives each row's text as it completes. A row also stops as soon as its text contains one
    of `stop_texts` (e.g. a chat model opening the next round); its text is cut there. `overlap` (default: on CUDA) queues the next
    decode step before reading the sampled ids, which may cost one extra step at a stop.
    """
    sampling = sampling or SamplingParams()
    stop_ids = frozenset(stop_ids)
    if first_logits is None:
        if prompts is None:
            raise ValueError("give prompts or first_logits")
        try:
            input_ids = torch.as_tensor(prompts, dtype=torch.long)
        except ValueError as e:  # ragged: a recurrent state cannot be padded
            raise ValueError("prompts of different lengths: prefill them yourself and pass "
                             "first_logits") from e
        if input_ids.ndim != 2 or input_ids.numel() == 0:
            raise ValueError("prompts must be a non-empty batch of non-empty prompts")
        first_logits = model.prefill(input_ids.to(_model_device(model)), state)
    logits = first_logits
    batch, vocab = logits.shape
    if overlap is None:
        overlap = logits.device.type == "cuda"

    token_ids: list[list[int]] = [[] for _ in range(batch)]
    reasons = ["length"] * batch
    running = set(range(batch))
    detok = [IncrementalDetokenizer(tokenizer) for _ in range(batch)] if on_text or stop_texts else None
    tails = [""] * batch  # the end of each row's text, long enough to hold any stop text
    tail_chars = max((len(t) for t in stop_texts), default=0)
    if max_new_tokens <= 0:
        running.clear()

    sample = _Sampler(sampling, batch, vocab, logits.device)
    host = _HostCopy(batch, logits.device)
    token = sample(logits) if running else None
    step = 0
    while running:
        step += 1
        last = step == max_new_tokens
        host.start(token)
        if overlap and not last:
            logits = model.decode(token, state)
        for row, tid in enumerate(host.wait()):
            if row not in running:
                continue
            if tid in stop_ids:
                reasons[row] = "stop"
                running.discard(row)
                continue
            token_ids[row].append(tid)
            if detok is not None:
                piece = detok[row].push(tid)
                if piece and stop_texts:
                    tails[row] = (tails[row] + piece)[-(tail_chars + len(piece)):]
                    if any(stop in tails[row] for stop in stop_texts):
                        reasons[row] = "stop"
                        running.discard(row)
                        continue
                if piece and on_text:
                    on_text(row, piece)
            if last:
                running.discard(row)
        if not running:
            break
        if not overlap:
            logits = model.decode(token, state)
        token = sample(logits)

    results = []
    for row in range(batch):
        text = tokenizer.decode(token_ids[row])
        for stop in stop_texts:
            text = text.split(stop, 1)[0]
        if on_text is not None:
            piece = detok[row].flush()
            if piece:
                on_text(row, piece)
        results.append(Generation(token_ids[row], text, reasons[row]))
    return results


def generate(
    model,
    prompt_ids: Sequence[int] | Tensor | None,
    state,
    *,
    tokenizer: Tokenizer,
    stop_ids: Collection[int],
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    on_text: Callable[[str], None] | None = None,
    first_logits: Tensor | None = None,
    overlap: bool | None = None,
    stop_texts: Collection[str] = (),
) -> Generation:
    """Generate one sequence (batch 1); see `generate_batch`.

    `prompt_ids` ([T] or [1, T]) is prefilled into `state` unless `first_logits` ([V] or [1, V])
    is given, in which case the prompt is already in `state`.
    """
    prompts = None
    if first_logits is None:
        if prompt_ids is None:
            raise ValueError("give prompt_ids or first_logits")
        prompts = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(1, -1)
    else:
        first_logits = first_logits.reshape(1, -1)
    callback = (lambda _row, text: on_text(text)) if on_text is not None else None
    return generate_batch(model, prompts, state, tokenizer=tokenizer, stop_ids=stop_ids,
                          max_new_tokens=max_new_tokens, sampling=sampling, on_text=callback,
                          first_logits=first_logits, overlap=overlap,
                          stop_texts=stop_texts)[0]

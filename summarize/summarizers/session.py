"""A loaded model with what it needs to talk: tokenizer, stop ids and sampling, made from `Settings`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from summarize.engine import load_model, load_tokenizer
from summarize.engine.generation.drafts import DraftCosts
from summarize.engine.generation.generate import GenerationRequest, SamplingParams, Speculation
from summarize.engine.generation.mtp_drafts import HeadCache
from summarize.engine.generation.sequences import Sequences
from summarize.engine.tokenizers.tokenizer import Tokenizer
from summarize.errors import SummarizeError
from summarize.settings import DEFAULT_PRESENCE_PENALTY, DEFAULT_SEED, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, Settings

# Qwen's recommendation for non-thinking use; the penalty keeps a small model from looping.
# A fixed default seed makes a run repeatable; --seed changes it.
DEFAULT_SAMPLING = SamplingParams(temperature=DEFAULT_TEMPERATURE, top_k=DEFAULT_TOP_K, top_p=DEFAULT_TOP_P,
                                  presence_penalty=DEFAULT_PRESENCE_PENALTY, seed=DEFAULT_SEED)


@dataclass
class ModelSession:
    """A loaded model with what it needs to talk: tokenizer, stop ids, sampling."""

    model: object
    tokenizer: Tokenizer  # or another family's tokenizer with the same surface (RwkvTokenizer)
    stop_ids: frozenset[int]
    sampling: SamplingParams
    name: str
    speculate: int = 0  # the most tokens drafted per decode step (0: none)
    mtp: bool = False  # drafts from the checkpoint's multi-token-prediction head, not the document
    draft_costs: DraftCosts = field(default_factory=DraftCosts)  # what verifying costs here, learnt as it runs

    def new_state(self, batch_size: int = 1) -> Sequences:
        """A new state for the model; with the MTP head's cache beside it when drafts come from the
        head, so that it reads the prompt as the model does (`mtp_drafts.HeadCache`)."""
        memory = HeadCache.new(self.model, batch_size) if self.mtp else None
        return Sequences(self.model.new_state(batch_size), memory)

    def request(self, max_new_tokens: int, contexts: list[list[int]]) -> GenerationRequest:
        """A generation of up to `max_new_tokens` tokens a row, with this session's stops, sampling
        and drafts; each row's drafts are looked up in its `contexts` entry (the text it was given)."""
        speculation = Speculation(self.speculate, mtp=self.mtp, costs=self.draft_costs) if self.speculate else None
        return GenerationRequest(
            tokenizer=self.tokenizer, stop_ids=self.stop_ids, max_new_tokens=max_new_tokens, sampling=self.sampling,
            contexts=contexts, speculation=speculation,
            stop_texts=self.tokenizer.stop_texts,  # RWKV: the answer ends where a new round opens
            banned_ids=self.tokenizer.banned_ids,  # RWKV-6 World: end-of-text is never sampled
        )


def load_session(settings: Settings, notify: Callable[[str], None],
                 waiting: Callable[[str | None], None] | None = None) -> ModelSession:
    """Load the model named in `settings` with its tokenizer and stop ids (raises ModelNotAvailable).

    `waiting` is told what the user waits for while it lasts (a str), then that it is over (None):
    loading, and later each compile of a step at its first use (on a machine's first run, the
    prefill step's takes longest), which `notify` then hears with its seconds."""
    dtype = getattr(torch, settings.dtype) if settings.dtype else None
    waiting = waiting or (lambda what: None)
    started = time.perf_counter()
    waiting("loading the model")
    try:
        model = load_model(settings.model, device=settings.device, dtype=dtype, quantize=engine_quantize(settings),
                           announce=_compiles_told(waiting, notify))
    finally:
        waiting(None)
    tokenizer, stop_ids = load_tokenizer(model)
    for note in model.load_notes:
        notify(note)
    notify(f"model {settings.model} on {model.device} ({_precision(model, settings)}), {_steps(model)}, "
           f"ready in {time.perf_counter() - started:.0f} s")
    mtp = settings.drafts == "mtp" and settings.speculate > 0
    if mtp and getattr(model, "mtp", None) is None:
        raise SummarizeError(f"{settings.model} has no multi-token-prediction head (mtp.* weights) to draft "
                             "from; use --drafts document")
    return ModelSession(model, tokenizer, stop_ids, sampling_for(settings), settings.model, settings.speculate, mtp=mtp)


def sampling_for(settings: Settings) -> SamplingParams:
    """DEFAULT_SAMPLING with the choices `settings` make (temperature, top-k, top-p, seed)."""
    return SamplingParams(
        temperature=DEFAULT_SAMPLING.temperature if settings.temperature is None else settings.temperature,
        top_k=DEFAULT_SAMPLING.top_k if settings.top_k is None else settings.top_k,
        top_p=DEFAULT_SAMPLING.top_p if settings.top_p is None else settings.top_p,
        presence_penalty=DEFAULT_SAMPLING.presence_penalty,
        seed=DEFAULT_SAMPLING.seed if settings.seed is None else settings.seed,
    )


def engine_quantize(settings: Settings) -> str | None:
    """`load_model`'s quantize for `settings.quantize` (None: "auto"; "none": None)."""
    return {None: "auto", "none": None}.get(settings.quantize, settings.quantize)


def weight_forms(model, settings: Settings) -> list[str]:
    """The forms `model` reads and writes with beyond its dtype: ["int8"], ["int4"], quantize="auto"'s
    ["int8 reads"] and ["int4 copy"] (either or both), or []."""
    auto = [form for form, held in (("int8 reads", model.reads_int8), ("int4 copy", model.int4_copy_bytes)) if held]
    return auto or [form for form in [settings.quantize] if form not in (None, "none")]


def _precision(model, settings: Settings) -> str:
    said = {"int4 copy": f"an int4 copy ({model.int4_copy_bytes / 2**30:.2f} GiB) to write with",
            "int8 reads": "int8 weights read with int8 activations"}
    forms = [said.get(form, f"{form} weights") for form in weight_forms(model, settings)]
    return ", ".join([str(model.dtype).removeprefix("torch."), *forms])


def _steps(model) -> str:
    return "eager steps" if model.compiled is None else "compiled steps"


def _compiles_told(waiting: Callable[[str | None], None], notify: Callable[[str], None]) -> Callable[[str | None], None]:
    """`waiting` for the live view while a step compiles, and a note when it is done:
    "compiled the prefill step in N s" (a first run on a machine compiles; later ones read
    inductor's disk cache)."""
    current: dict = {}

    def announce(what: str | None) -> None:
        if what is not None:
            current.update(what=what, since=time.perf_counter())
        elif "what" in current:
            done = current.pop("what").replace("compiling", "compiled", 1)
            notify(f"{done} in {time.perf_counter() - current['since']:.0f} s")
        waiting(what)

    return announce

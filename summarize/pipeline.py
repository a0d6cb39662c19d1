"""Text in, summary out: the settings of a run and the summarizers behind one small protocol.

A new way of summarizing (the model engine) is one new class implementing `Summarizer`, chosen in
`make_summarizer`; batch handling, output files and the CLI do not change.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from summarize.errors import SummarizeError
from summarize.extractive import extractive_summary
from summarize.text import count_words

DEFAULT_MODEL = "Qwen/Qwen3.5-0.8B"
DEFAULT_WORDS = 300
STRATEGIES = ("map-reduce", "stream")

# Bump when the same settings start producing different output (new header format, new
# algorithm), so that files written by an older version stop counting as up to date.
FINGERPRINT_VERSION = 1
FINGERPRINT_LENGTH = 12


@dataclass(frozen=True)
class Settings:
    """Everything that shapes one run. `None` leaves the choice to the engine's defaults."""

    words: int = DEFAULT_WORDS
    model: str = DEFAULT_MODEL
    device: str | None = None
    dtype: str | None = None
    quantize: str | None = None
    chunk_tokens: int | None = None
    overlap: int | None = None
    strategy: str = "map-reduce"
    extractive: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    diagnostics_file: str | None = None
    password: str | None = field(default=None, repr=False)
    verbose: bool = False

    def fingerprint(self, method: str | None = None) -> str:
        """A short, stable hash of the settings that change a summary made by `method`.

        `method` defaults to the one these settings ask for; pass the method that actually
        produced a summary (an extractive fallback, say) to describe that summary truthfully.
        Device, password, verbosity and diagnostics do not change the text, so they are left out.
        """
        method = method or ("extractive" if self.extractive else "model")
        shaping: dict[str, Any] = {"v": FINGERPRINT_VERSION, "method": method, "words": self.words}
        if method != "extractive":
            shaping |= {
                "model": self.model,
                "dtype": self.dtype,
                "chunk_tokens": self.chunk_tokens,
                "overlap": self.overlap,
                "strategy": self.strategy,
                "temperature": self.temperature,
                "top_k": self.top_k,
                "top_p": self.top_p,
                "seed": self.seed,
            }
            if self.quantize:  # absent when unset: fingerprints of earlier runs stay valid
                shaping["quantize"] = self.quantize
        blob = json.dumps(shaping, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:FINGERPRINT_LENGTH]


@dataclass
class Summary:
    """One input's summary. `extra` carries method-specific fields (model id, tokens, ...)."""

    text: str
    words: int
    method: str  # "extractive" or "model"
    input: str
    seconds: float  # time spent summarizing the text, extraction excluded
    extra: dict[str, Any] = field(default_factory=dict)


class Summarizer(Protocol):
    method: str

    def summarize(self, text: str, *, name: str) -> Summary:
        """Summarize `text` (read from input `name`) or raise SummarizeError."""
        ...


class Notifier(Protocol):
    def note(self, msg: str) -> None: ...


class ExtractiveSummarizer:
    """Picks the document's most representative sentences; no model needed."""

    method = "extractive"

    def __init__(self, settings: Settings):
        self.words = settings.words

    def summarize(self, text: str, *, name: str) -> Summary:
        start = time.perf_counter()
        summary = extractive_summary(text, self.words)
        if not summary.strip():
            raise SummarizeError(f"{name}: no sentence fits in {self.words} words")
        return Summary(
            text=summary,
            words=count_words(summary),
            method=self.method,
            input=name,
            seconds=time.perf_counter() - start,
        )


def make_summarizer(settings: Settings, ui: Notifier) -> Summarizer:
    """The summarizer for these settings. Call it once per run: it may load a model.

    A model that cannot be had (offline and not cached, no such folder) is not an error: the user
    is told in one line and gets the extractive summary.
    """
    extractive = ExtractiveSummarizer(settings)
    if settings.extractive:
        return extractive
    from summarize.abstractive import ModelSummarizer, load_session
    from summarize.engine import ModelNotAvailable

    try:
        session = load_session(settings, ui.note)
    except ModelNotAvailable as exc:
        ui.note(f"{exc}; writing an extractive summary instead")
        return extractive
    diagnostics = open(settings.diagnostics_file, "w", encoding="utf-8") if settings.diagnostics_file else None
    return ModelSummarizer(
        session,
        words=settings.words,
        strategy=settings.strategy,
        chunk_tokens=settings.chunk_tokens,
        overlap=settings.overlap,
        fallback=extractive,
        notify=ui.note,
        on_span=ui.span if getattr(ui, "shows_live_state", False) else None,
        on_phase=getattr(ui, "phase", None),
        diagnostics=diagnostics,
    )

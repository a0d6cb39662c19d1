"""The shared vocabulary of the application: constants, the settings of a run, its results, and the
protocols the summarizers and the UI implement. It sits at the bottom: it imports nothing of ours.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

DEFAULT_MODEL = "Qwen/Qwen3.5-0.8B"
DEFAULT_WORDS = 300

MAP_REDUCE = "map-reduce"  # every chunk read alone from the instruction, the notes merged
STREAM = "stream"  # one pass, the state carried across the whole document
STRATEGIES = (MAP_REDUCE, STREAM)
DEFAULT_STRATEGY = MAP_REDUCE

STDIN = "-"  # the input name that reads standard input
STDIN_LABEL = "<stdin>"  # how messages name it

# Bump when the same settings start producing different output (new header format, new
# algorithm), so that files written by an older version stop counting as up to date.
FINGERPRINT_VERSION = 1
FINGERPRINT_LENGTH = 12

Status = Literal["ok", "skipped", "failed"]


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
    strategy: str = DEFAULT_STRATEGY
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


@dataclass(frozen=True)
class Job:
    """One input and where its summary goes (`output` None: stdout)."""

    input: str  # a path as the user would write it, or "-" for stdin
    output: Path | None = None
    problem: str = ""  # known before reading anything: this job fails with this reason

    @property
    def is_stdin(self) -> bool:
        return self.input == STDIN

    @property
    def label(self) -> str:
        return STDIN_LABEL if self.is_stdin else self.input


@dataclass
class Result:
    """What became of one input: summarized, skipped (up to date) or failed, and why."""

    input: str
    status: Status
    reason: str = ""  # one line; why it failed or was skipped
    output: Path | None = None
    summary: Summary | None = field(default=None, repr=False)
    seconds: float | None = None  # reading and summarizing this input

    @property
    def words(self) -> int | None:
        return None if self.summary is None else self.summary.words


@dataclass
class ModelProgress:
    """Where the model summarizer is, for the diagnostics records and the live view."""

    input: str = ""
    chunk: int | None = None
    chunks: int = 0
    phase: str = "prefill"
    rows: list[tuple[str, int | None]] | None = None  # (input, chunk) of each row while rows decode together
    counters: dict[str, int] = field(default_factory=dict)


class Summarizer(Protocol):
    """Text in, `Summary` out. A new way of summarizing is one new class with these members."""

    method: str

    @property
    def documents_per_batch(self) -> int:
        """How many documents to hand to `summarize_documents` at once."""
        ...

    def summarize(self, text: str, *, name: str) -> Summary:
        """Summarize `text` (read from input `name`) or raise SummarizeError."""
        ...

    def summarize_documents(self, documents: list[tuple[str, str]]) -> list[Summary | Exception]:
        """Summaries of (text, name) documents, in order; a document's failure in its place."""
        ...

    def close(self) -> None:
        """Release what the summarizer holds (the diagnostics file); called when the run ends."""
        ...


class Reporter(Protocol):
    """What the library tells the user about, through the UI (stderr only, never stdout).

    `report` in `span` is the engine's SpanReport; it is not named here, so that this module
    stays below the engine.
    """

    def note(self, msg: str) -> None: ...

    def error(self, msg: str, *, exc: BaseException | None = None) -> None: ...

    def file_started(self, name: str, i: int, n: int) -> None: ...

    def file_finished(self, result: Result) -> None: ...

    def results_table(self, results: Sequence[Result]) -> None: ...

    @property
    def shows_live_state(self) -> bool:
        """Whether `span` is worth calling: per-token reports cost ~10% of a decode step."""
        ...

    def phase(self, progress: ModelProgress) -> None: ...

    def span(self, progress: ModelProgress, report: Any) -> None: ...

    def close(self) -> None: ...

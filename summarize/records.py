"""The records of a run: one input's job, its summary and what became of it, and where the model
summarizer is (for the diagnostics and the live view). It imports nothing of ours but the settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from summarize.settings import STDIN, STDIN_LABEL

Status = Literal["ok", "skipped", "failed"]


@dataclass(frozen=True)
class Source:
    """Where one sentence of a summary comes from (summarizers/citations.py)."""

    start: int  # the sentence's span in the summary's text without citations
    end: int
    text: str  # the sentence, its list mark left out
    cite: str  # as --cite writes it: "p. 12–14", "§ Methods", "l. 10–42"; "" when nothing matched
    places: dict[str, list]  # for --json: {"pages": [12, 13, 14]}, {"sections": [...]}, {"lines": [[10, 42]]}
    score: float  # the BM25 score of the best passage

    def record(self, index: int) -> dict[str, Any]:
        """The sentence's entry in --json's `sources`."""
        return {"sentence": index, "text": self.text, **self.places, "cite": self.cite or None,
                "score": round(self.score, 3)}


@dataclass
class Summary:
    """One input's summary. `text` is what is printed (with --cite, its citations); `words` counts
    it without them. `extra` carries method-specific fields (model id, tokens, ...)."""

    text: str
    words: int
    method: str  # "extractive" or "model"
    input: str
    seconds: float  # time spent summarizing the text, extraction excluded
    extra: dict[str, Any] = field(default_factory=dict)
    sources: list[Source] = field(default_factory=list)  # one per sentence, in order


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

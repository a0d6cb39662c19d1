"""The contract every summarizer keeps: text in, `Summary` out.
"""

from __future__ import annotations

from typing import Protocol

from summarize.inputs.places import Places
from summarize.records import Summary


class DocumentSummarizer(Protocol):
    """Text in, `Summary` out. A new way of summarizing is one new class with these members."""

    method: str

    @property
    def documents_per_batch(self) -> int:
        """How many documents to hand to `summarize_documents` at once."""
        ...

    def summarize(self, text: str, *, name: str, places: Places | None = None) -> Summary:
        """Summarize `text` (read from input `name`, its parts from `places`: None finds them in
        the text itself) or raise SummarizeError."""
        ...

    def summarize_documents(self, documents: list[tuple[str, str]],
                            places: list[Places | None] | None = None) -> list[Summary | Exception]:
        """Summaries of (text, name) documents (their places, one each), in order; a document's
        failure in its place."""
        ...

    def close(self) -> None:
        """Release what the summarizer holds (the diagnostics file); called when the run ends."""
        ...

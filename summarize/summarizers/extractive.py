"""The `Summarizer` that needs no model: the document's most representative sentences."""

from __future__ import annotations

import time

from summarize.errors import SummarizeError
from summarize.inputs.words import count_words
from summarize.records import Summary
from summarize.settings import Settings
from summarize.summarizers.extractive_selection import extractive_summary


class ExtractiveSummarizer:
    """Picks the document's most representative sentences; no model needed."""

    method = "extractive"
    documents_per_batch = 1  # nothing is shared between documents: one at a time

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

    def summarize_documents(self, documents: list[tuple[str, str]]) -> list[Summary | Exception]:
        results: list[Summary | Exception] = []
        for text, name in documents:
            try:
                results.append(self.summarize(text, name=name))
            except SummarizeError as exc:
                results.append(exc)
        return results

    def close(self) -> None:
        pass  # holds nothing

"""The `Summarizer` that needs no model: the document's most representative sentences."""

from __future__ import annotations

import time
import unicodedata

from summarize.errors import SummarizeError
from summarize.inputs.words import count_words
from summarize.records import Summary
from summarize.settings import Settings
from summarize.summarizers.extractive_selection import extractive_summary

# Scripts written without spaces (Thai, Lao, Khmer), emoji and one endless "word" count as one word
# per run: the cap on -n holds in characters too, at this many a word (English averages six).
MAX_CHARS_PER_WORD = 20
ELLIPSIS = "…"


def cap_characters(text: str, words: int) -> str:
    """`text`, or its start cut to `words` × MAX_CHARS_PER_WORD characters with an ellipsis: at the
    last space in the second half of that, else between characters (never inside a combining
    sequence or an emoji's joined parts)."""
    limit = words * MAX_CHARS_PER_WORD
    if len(text) <= limit:
        return text
    cut = limit - len(ELLIPSIS)
    space = text.rfind(" ", cut // 2, cut + 1)
    if space > 0:
        cut = space
    while 0 < cut < len(text) and (_joins_previous(text[cut]) or text[cut - 1] == "\u200d"):
        cut -= 1
    return text[:cut].rstrip() + ELLIPSIS


def _joins_previous(char: str) -> bool:
    """Whether `char` belongs to the character before it: a combining mark, a zero-width joiner, a
    variation selector or an emoji skin tone."""
    return (unicodedata.combining(char) > 0 or unicodedata.category(char) in ("Mn", "Mc", "Me")
            or char in "\u200d\ufe0e\ufe0f" or "\U0001f3fb" <= char <= "\U0001f3ff"
            or (char != "\u200d" and "\U000e0020" <= char <= "\U000e007f"))


class ExtractiveSummarizer:
    """Picks the document's most representative sentences; no model needed."""

    method = "extractive"
    documents_per_batch = 1  # nothing is shared between documents: one at a time

    def __init__(self, settings: Settings):
        self.words = settings.words

    def summarize(self, text: str, *, name: str) -> Summary:
        start = time.perf_counter()
        summary = cap_characters(extractive_summary(text, self.words), self.words)
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

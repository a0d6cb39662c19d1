"""The `Summarizer` that needs no model: the document's most representative sentences."""

from __future__ import annotations

import time
import unicodedata

from summarize.errors import SummarizeError
from summarize.inputs.places import Places, first_heading, text_places
from summarize.inputs.words import count_words
from summarize.records import Summary
from summarize.settings import PROSE, Settings
from summarize.summarizers.citations import sentence_passages, sources, with_citations
from summarize.summarizers.extractive_selection import extractive_sentences, extractive_summary
from summarize.summarizers.layout import lay_out

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
        self.form = settings.format
        self.cite = settings.cite

    def summarize(self, text: str, *, name: str, places: Places | None = None) -> Summary:
        start = time.perf_counter()
        summary = cap_characters(extractive_summary(text, self.words) if self.form == PROSE else self._listed(text),
                                 self.words)
        if not summary.strip():
            raise SummarizeError(f"{name}: no sentence fits in {self.words} words")
        places = places or text_places(text)
        # it quotes the document's sentences: each is found among them
        found = sources(summary, sentence_passages(text, places), places)
        return Summary(
            text=with_citations(summary, found) if self.cite else summary,
            words=count_words(summary),
            method=self.method,
            input=name,
            seconds=time.perf_counter() - start,
            sources=found,
        )

    def _listed(self, text: str) -> str:
        """The chosen sentences as a list of points (under the document's first heading in
        Markdown), chosen again for fewer words while the list's marks take it over -n."""
        budget, heading = self.words, first_heading(text)
        while True:
            points = extractive_sentences(text, budget)[0]
            over = count_words(lay_out(points, self.form, None, heading=heading)) - self.words  # the marks, the heading
            if over <= 0 or budget == 1:
                return lay_out(points, self.form, self.words, heading=heading)
            budget = max(1, budget - over)

    def summarize_documents(self, documents: list[tuple[str, str]],
                            places: list[Places | None] | None = None) -> list[Summary | Exception]:
        results: list[Summary | Exception] = []
        for (text, name), where in zip(documents, places or [None] * len(documents)):
            try:
                results.append(self.summarize(text, name=name, places=where))
            except SummarizeError as exc:
                results.append(exc)
        return results

    def close(self) -> None:
        pass  # holds nothing

"""Where each sentence of a summary came from: computed, never asked of the model.

Each sentence of the summary is matched with BM25 against the passages it was written from: the
model's chunks, each with the notes written on it, or, for an extractive summary, the document's
sentences, which it quotes. The sentence cites the places (pages, sections, lines: inputs/places.py)
of the best-scoring passage, and of the second best too when that scores at least SECOND_SHARE of
the best (a sentence read in the overlap of two chunks, or said twice in the document), unless
only one of the two holds the sentence word for word: a quote cites where it was quoted from, not
a near repeat of it elsewhere. Ties go to the earlier passage, so the same summary always cites
the same places.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from dataclasses import dataclass

from summarize.inputs.places import JSON_KEYS, Places
from summarize.inputs.words import sentence_spans
from summarize.records import Source
from summarize.summarizers.extractive_selection import terms

# BM25's usual constants: how fast a term's weight saturates with its count in a passage, and how
# much a long passage is discounted for its length.
K1 = 1.2
B = 0.75
SECOND_SHARE = 0.8  # a second passage is cited too when it scores at least this share of the best
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")  # "tier 1" is not "tier 2": numbers are terms here
_MARK = re.compile(r"(?:[-*•]|#{1,6})[ \t]+")  # a list item's or a heading's mark, before a sentence
_TERMINAL = re.compile(r"[.!?…。！？｡]+\Z")  # where a sentence ends: its citation goes before it


@dataclass(frozen=True)
class Passage:
    """What a sentence of a summary may come from: `text` (with the notes written on it, for a
    chunk), covering `places` of the document."""

    text: str
    places: range


def _terms(text: str) -> list[str]:
    """The extractive summary's terms (words less stopwords, plurals folded; CJK characters and
    bigrams), and the numbers, which its similarity leaves out and a citation needs."""
    return terms(text) + _NUMBER.findall(text)


def sentence_passages(text: str, places: Places) -> list[Passage]:
    """The document's sentences as passages: what an extractive summary quotes."""
    return [Passage(text[s:e], places.covering(text, s, e)) for s, e in sentence_spans(text)]


class _BM25:
    """Okapi BM25 over the passages: score(q, p) = Σ over the terms t of q found in p of
    idf(t) · f(t, p) (K1 + 1) / (f(t, p) + K1 (1 − B + B |p| / avg |p|)),
    with idf(t) = ln(1 + (N − n(t) + 0.5) / (n(t) + 0.5)) over N passages, n(t) of them holding t."""

    def __init__(self, texts: list[str]) -> None:
        counts = [Counter(_terms(text)) for text in texts]
        lengths = [sum(count.values()) for count in counts]
        average = sum(lengths) / len(lengths) if lengths and sum(lengths) else 1.0
        self.postings: dict[str, list[tuple[int, float]]] = {}  # term -> (passage, its saturated count)
        for passage, (count, length) in enumerate(zip(counts, lengths)):
            norm = K1 * (1 - B + B * length / average)
            for term, f in count.items():
                self.postings.setdefault(term, []).append((passage, f * (K1 + 1) / (f + norm)))
        n = len(texts)
        self.idf = {term: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) for term, p in self.postings.items()}

    def best(self, query: list[str], k: int) -> list[tuple[float, int]]:
        """The `k` best (score, passage) for the query's terms, best first, ties to the earlier passage."""
        scores: Counter[int] = Counter()
        for term in set(query):
            for passage, weight in self.postings.get(term, ()):
                scores[passage] += self.idf[term] * weight
        return [(score, -negative) for score, negative in
                heapq.nlargest(k, ((score, -passage) for passage, score in scores.items()))]


def sources(summary: str, passages: list[Passage], places: Places) -> list[Source]:
    """Where each sentence of `summary` (its headings left out) comes from, in order."""
    index = _BM25([passage.text for passage in passages])
    found = []
    for start, end in sentence_spans(summary):
        if summary.startswith("#", start):
            continue
        mark = _MARK.match(summary, start, end)
        text = summary[mark.end() if mark else start : end]
        ranked = index.best(_terms(text), 2)
        if not ranked or ranked[0][0] <= 0:
            found.append(Source(start, end, text, "", {JSON_KEYS[places.kind]: []}, 0.0))
            continue
        best = ranked[0][0]
        close = [i for score, i in ranked if score >= SECOND_SHARE * best]
        quoted = [i for i in close if _holds(passages[i].text, text)]
        spans = [passages[i].places for i in (quoted if len(quoted) == 1 else close)]
        found.append(Source(start, end, text, places.cite(spans), places.listed(spans), best))
    return found


def _holds(passage: str, sentence: str) -> bool:
    """Whether `passage` has `sentence` word for word (whitespace aside)."""
    return " ".join(sentence.split()) in " ".join(passage.split())


def with_citations(summary: str, found: list[Source]) -> str:
    """`summary` with each sentence ending in its citation, before its closing punctuation:
    "Rates rose (p. 12–14)." A sentence that matched nothing is left as it is."""
    parts, done = [], 0
    for source in found:
        if not source.cite:
            continue
        closing = _TERMINAL.search(summary, source.start, source.end)
        at = closing.start() if closing else source.end
        parts += [summary[done:at], f" ({source.cite})"]
        done = at
    return "".join(parts) + summary[done:]

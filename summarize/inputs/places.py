"""Where each part of a document's clean text came from, so that a summary can cite it: the pages
of a PDF (or of text with form feeds), the chapters of an EPUB book, the sections under Markdown
headings, the lines of a text file, the paragraphs of anything else.

Extraction reflows text (lines joined, hyphens and running headers dropped), so the source's
offsets are lost; the order of its letters and digits is not. A part of the source is found in
the clean text by counting them: the part holding the source's letters and digits k to k + n holds
the clean text's k to k + n (`aligned`).
"""

from __future__ import annotations

import bisect
import re
from array import array
from dataclasses import dataclass

PAGE, SECTION, LINE, PARAGRAPH = "page", "section", "line", "paragraph"
# How a citation names each kind, "(p. 12–14)", "(§ Methods)", "(l. 10–42)", "(¶ 4)", and its key in --json.
PREFIXES = {PAGE: "p.", SECTION: "§", LINE: "l.", PARAGRAPH: "¶"}
JSON_KEYS = {PAGE: "pages", SECTION: "sections", LINE: "lines", PARAGRAPH: "paragraphs"}
MAX_TITLE_CHARS = 40  # a section's title in a citation; a longer one is cut with an ellipsis
MIN_HEADINGS = 2  # fewer headings than this cut a text into no useful sections

_LETTERS_OR_DIGITS = re.compile(r"[^\W_]+")
_LAST_LETTER_OR_DIGIT = re.compile(r"[^\W_][\W_]*\Z")
# A Markdown heading opening a paragraph of the clean text (extraction gives headings a paragraph each).
_HEADING = re.compile(r"(?:\A|\n\n)#{1,6}[ \t]+([^\n]*)")


@dataclass(frozen=True)
class Places:
    """The places of one kind that a clean text is cut into: place i starts at `starts[i]` (the
    first at 0, ascending; a place with no letters or digits shares the next one's start) and is
    named `labels[i]`, or i + 1 where `labels` is None (pages, lines, paragraphs)."""

    kind: str
    starts: array
    labels: tuple[str, ...] | None = None

    def label(self, index: int) -> str:
        return str(index + 1) if self.labels is None else self.labels[index]

    def covering(self, text: str, start: int, end: int) -> range:
        """The places that `text[start:end]` takes its letters and digits from, first to last (the
        place of `start` for a span without any)."""
        first = _LETTERS_OR_DIGITS.search(text, start, end)
        if first is None:
            return range(self._at(start), self._at(start) + 1)
        last = _LAST_LETTER_OR_DIGIT.search(text, first.start(), end)
        return range(self._at(first.start()), self._at(last.start() if last else first.start()) + 1)

    def _at(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self.starts, offset) - 1)

    def cite(self, spans: list[range]) -> str:
        """How a citation names these spans of places: "p. 3", "p. 12–14, 20", "§ Methods; Results",
        "§ Methods – Results" (the sections from one to the other)."""
        parts = []
        for span in _merged(spans):
            first, last = self.label(span[0]), self.label(span[-1])
            dash = " – " if self.kind == SECTION else "–"
            parts.append(first if len(span) == 1 else f"{first}{dash}{last}")
        return f"{PREFIXES[self.kind]} {('; ' if self.kind == SECTION else ', ').join(parts)}"

    def listed(self, spans: list[range]) -> dict:
        """The places of these spans for --json: {"pages": [12, 13, 14]}, {"sections": ["Methods"]},
        {"lines": [[10, 42]]}, {"paragraphs": [[4, 6]]} (lines and paragraphs as first-last pairs)."""
        merged = _merged(spans)
        if self.kind == PAGE:
            value: list = [int(self.label(i)) for span in merged for i in span]
        elif self.kind == SECTION:
            value = [self.label(i) for span in merged for i in span]
        else:
            value = [[int(self.label(span[0])), int(self.label(span[-1]))] for span in merged]
        return {JSON_KEYS[self.kind]: value}


def _merged(spans: list[range]) -> list[range]:
    """The spans in order, those that overlap or touch joined."""
    merged: list[range] = []
    for span in sorted((s for s in spans if len(s)), key=lambda s: s.start):
        if merged and span.start <= merged[-1].stop:
            merged[-1] = range(merged[-1].start, max(merged[-1].stop, span.stop))
        else:
            merged.append(span)
    return merged


def aligned(kind: str, parts: list[str], text: str, labels: list[str] | None = None) -> Places:
    """The places of `parts`, the pieces of a source in order, in `text`, the clean text made of
    them: each starts where the clean text reaches the letters and digits of the parts before it."""
    starts = array("q")
    runs = _LETTERS_OR_DIGITS.finditer(text)
    run = next(runs, None)
    seen = 0  # letters and digits of `text` before `run`
    wanted = 0  # letters and digits of the parts before this one
    for part in parts:
        while run is not None and seen + run.end() - run.start() <= wanted:
            seen += run.end() - run.start()
            run = next(runs, None)
        starts.append(0 if not starts else len(text) if run is None else run.start() + wanted - seen)
        wanted += sum(len(r) for r in _LETTERS_OR_DIGITS.findall(part))
    return Places(kind, starts or array("q", [0]), None if labels is None else tuple(labels))


def sections(text: str) -> Places | None:
    """The sections of a clean text under its Markdown headings, each named by its heading's title
    (its number where the heading has none; the text before the first heading is § 0); None for
    a text with fewer than MIN_HEADINGS headings."""
    headings = list(_HEADING.finditer(text))
    if len(headings) < MIN_HEADINGS:
        return None
    starts, labels = array("q"), []
    first = headings[0].start(0) + (0 if headings[0].group(0).startswith("#") else 2)
    if first > 0:
        starts.append(0)
        labels.append("0")
    for number, heading in enumerate(headings, start=1):
        starts.append(heading.start(0) + (0 if heading.group(0).startswith("#") else 2))
        labels.append(heading_title(heading.group(1)) or str(number))
    return Places(SECTION, starts, tuple(labels))


def heading_title(heading: str) -> str:
    """A heading's text (its `#` marks gone) as a citation names it: one line, at most MAX_TITLE_CHARS."""
    title = " ".join(heading.rstrip("# \t").split())
    return title if len(title) <= MAX_TITLE_CHARS else title[: MAX_TITLE_CHARS - 1].rstrip() + "…"


def first_heading(text: str) -> str:
    """The title of a clean text's first Markdown heading that has one, whole ("" without one)."""
    titles = (" ".join(heading.group(1).rstrip("# \t").split()) for heading in _HEADING.finditer(text))
    return next((title for title in titles if title), "")


def paragraphs(text: str) -> Places:
    """The paragraphs of a clean text (separated by blank lines), numbered from 1."""
    return Places(PARAGRAPH, array("q", [0, *(m.end() for m in re.finditer("\n\n", text))]))


def lines(source: str, text: str) -> Places:
    """The lines of `source`, a text file as decoded, in `text`, its clean text; numbered from 1 as
    an editor numbers them."""
    return aligned(LINE, source.replace("\r\n", "\n").replace("\r", "\n").split("\n"), text)


@dataclass(frozen=True)
class Document:
    """A document's clean text and where each part of it came from."""

    text: str
    places: Places


def text_places(text: str) -> Places:
    """The places of a text given as it is, without a source to align (a string handed to the
    library): its sections where it has headings, else its lines."""
    return sections(text) or lines(text, text)

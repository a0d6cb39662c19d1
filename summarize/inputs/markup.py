"""The text of an (X)HTML document that is all content, such as an EPUB chapter: one paragraph per
block, headings as Markdown `#` lines, table rows as cells joined by " | ". Nothing is judged
boilerplate here (web pages go through html.py for that).
"""

from __future__ import annotations

from html.parser import HTMLParser

HEADINGS = {f"h{level}": level for level in range(1, 7)}
# Tags whose start or end ends a paragraph.
BLOCKS = {"address", "article", "aside", "blockquote", "body", "caption", "dd", "div", "dl", "dt", "figcaption",
          "figure", "footer", "header", "hr", "li", "main", "nav", "ol", "p", "pre", "section", "table", "tr", "ul"}
# Tags whose content is not text to read.
HIDDEN = {"head", "script", "style", "template", "svg", "math", "noscript"}
CELLS = {"td", "th"}
CELL_SEPARATOR = " | "


def markup_text(markup: str) -> str:
    """Paragraphs separated by blank lines, whitespace collapsed within each."""
    parser = _Paragraphs()
    parser.feed(markup)
    parser.close()
    parser.end_paragraph()
    return "\n\n".join(parser.paragraphs)


class _Paragraphs(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self._words: list[str] = []
        self._hidden = 0  # depth inside HIDDEN tags
        self._heading = 0  # level of the heading being read, 0 outside one
        self._cells = 0  # cells begun in the current table row
        self._in_cell = 0  # depth inside td/th: paragraphs there are parts of the row

    def end_paragraph(self) -> None:
        text = " ".join(" ".join(self._words).split())
        if text.strip("| "):
            self.paragraphs.append(f"{'#' * self._heading} {text}" if self._heading else text)
        self._words = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in HIDDEN:
            self._hidden += 1
        elif tag in CELLS:
            if self._cells:
                self._words.append(CELL_SEPARATOR)
            self._cells += 1
            self._in_cell += 1
        elif (tag in HEADINGS or tag in BLOCKS) and not (self._in_cell and tag not in ("tr", "table")):
            self.end_paragraph()
            self._heading = HEADINGS.get(tag, 0)
            self._cells = 0 if tag == "tr" else self._cells
        elif tag == "br" or tag in HEADINGS or tag in BLOCKS:  # a block inside a cell: a word break
            self._words.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in HIDDEN:
            self._hidden = max(0, self._hidden - 1)
        elif tag in CELLS:
            self._in_cell = max(0, self._in_cell - 1)
        elif (tag in HEADINGS or tag in BLOCKS) and not (self._in_cell and tag not in ("tr", "table")):
            self.end_paragraph()
            self._heading = 0

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self._words.append(data)

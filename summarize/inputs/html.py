"""The main text of a web page, its navigation, banners, footers and comments left out: that is
trafilatura's job (the `html` extra). Headings come as Markdown `#` lines, table rows as cells
joined by " | ", as the other inputs give them. A page of more than MAX_BLOCKS blocks is read
whole by the plain markup reader instead, with a note.
"""

from __future__ import annotations

import codecs
import re

from summarize.inputs.markup import CELL_SEPARATOR, markup_text
from summarize.inputs.read_bytes import ExtractionError
from summarize.settings import format_size

HTML_SUFFIXES = (".html", ".htm", ".xhtml")
EXTRA = "html"
# trafilatura's work grows faster than the number of a page's blocks: a page of tens of thousands
# (a long thread, a whole book on one page) would take minutes. Past this many, it is not asked.
MAX_BLOCKS = 5000
_BLOCK = re.compile(rb"<(?:p|div|li)[\s>/]", re.IGNORECASE)  # counted in the bytes, before any parsing
_CHARSET = re.compile(rb"""charset\s*=\s*["']?([\w.:-]+)""", re.IGNORECASE)
_CHARSET_SNIFF = 4096  # bytes searched for a declared charset, as browsers look in the head
_HTML_STARTS = (b"<!doctype html", b"<html")
_TABLE_RULE = re.compile(r"\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?")  # |---|---|


def looks_like_html(data: bytes) -> bool:
    """A whole HTML page by its first bytes (a fragment needs its .html suffix)."""
    return data[:256].lstrip(b"\xef\xbb\xbf \t\r\n").lower().startswith(_HTML_STARTS)


def html_main_text(data: bytes, label: str, notes: list[str]) -> str:
    """Paragraphs separated by blank lines; ExtractionError when trafilatura is missing or finds no
    text. A page of more than MAX_BLOCKS blocks is read whole (`markup_text`), said in `notes`."""
    if many_blocks(data):
        notes.append(f"{label}: more than {MAX_BLOCKS:,} blocks (<p>, <div>, <li>), too many to pick the main "
                     "text from: read whole, navigation and footers included")
        return markup_text(_decoded(data))
    try:
        import trafilatura
    except ImportError as exc:
        raise ExtractionError(f"{label}: reading web pages needs the '{EXTRA}' extra: "
                              f"pip install 'summarize[{EXTRA}]'") from exc
    from trafilatura.settings import DEFAULT_CONFIG

    most = DEFAULT_CONFIG.getint("DEFAULT", "MAX_FILE_SIZE")  # trafilatura's work grows faster than the page
    if len(data) > most:
        raise ExtractionError(f"{label}: larger than {format_size(most)}, the most a web page is read for its main text")
    # trafilatura decodes the bytes itself, by the page's declared charset or by detection.
    options = dict(output_format="markdown", include_tables=True, include_comments=False, include_images=False,
                   include_links=False, fast=True)  # fast: no fallback extractors, whose cost grows as blocks squared
    text = trafilatura.extract(data, **options)
    if not text:  # a short page can fall under its thresholds: look harder before giving up
        text = trafilatura.extract(data, favor_recall=True, **options)
    if not text:
        raise ExtractionError(f"{label}: no main text found in the page")
    return "\n\n".join(_rows_as_paragraphs(text.split("\n")))


def many_blocks(data: bytes) -> bool:
    """Whether the page has more than MAX_BLOCKS <p>, <div> and <li> tags (counted up to one more)."""
    found = 0
    for _ in _BLOCK.finditer(data):
        found += 1
        if found > MAX_BLOCKS:
            return True
    return False


def _decoded(data: bytes) -> str:
    """The page as text: by its BOM, else the charset it declares in its head, else UTF-8; bytes
    that do not decode become U+FFFD."""
    if data.startswith(codecs.BOM_UTF8):
        return data[len(codecs.BOM_UTF8):].decode("utf-8", errors="replace")
    declared = _CHARSET.search(data, 0, _CHARSET_SNIFF)
    try:
        codec = codecs.lookup(declared[1].decode("ascii")).name if declared else "utf-8"
    except LookupError:
        codec = "utf-8"
    return data.decode(codec, errors="replace")


def _rows_as_paragraphs(lines: list[str]) -> list[str]:
    """Markdown table rows as paragraphs of cells (their rule lines dropped); other lines as they are."""
    out = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("|") and stripped.endswith("|"):
            if not _TABLE_RULE.fullmatch(stripped):
                out.append(CELL_SEPARATOR.join(cell.strip() for cell in stripped[1:-1].split("|")))
        else:
            out.append(line)
    return out

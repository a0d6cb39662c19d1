"""Turn an input (PDF, EPUB, Word .docx, HTML, plain text, Markdown, an http(s) URL or stdin) into
clean text for the chunker."""

from __future__ import annotations

import codecs
import contextlib
import io
import logging
import math
import re
import unicodedata
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from pypdf import PageObject, PasswordType, PdfReader
from pypdf.errors import DependencyError, EmptyFileError

from summarize.errors import first_line
from summarize.inputs.archive import Archive
from summarize.inputs.docx import docx_text, is_docx
from summarize.inputs.epub import epub_chapters, is_epub
from summarize.inputs.html import HTML_SUFFIXES, html_main_text, looks_like_html
from summarize.inputs.places import PAGE, SECTION, Document, aligned, lines, paragraphs, sections
from summarize.inputs.read_bytes import (
    ExtractionError,
    known_kind,
    looks_like_pdf,
    looks_like_zip,
    read_file,
    read_local_input,
    utf16_without_bom,
)
from summarize.inputs.url import is_url, read_url, url_suffix
from summarize.settings import DEFAULT_MAX_INPUT_SIZE, STDIN, STDIN_LABEL, format_size

__all__ = ["Document", "ExtractionError", "SUPPORTED_SUFFIXES", "clean_text", "document_from_bytes", "extract_document",
           "extract_text", "iter_pdf_pages", "read_input", "text_from_bytes"]

SUPPORTED_SUFFIXES = (".pdf", ".txt", ".md", ".epub", ".docx", ".html", ".htm")
MARKDOWN_SUFFIXES = (".md", ".markdown")
ZIPPED_SUFFIXES = (".epub", ".docx")
QUIET_LOGGERS = ("pypdf", "trafilatura", "justext")  # parents of every pypdf.*, trafilatura.* logger


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def extract_text(
    source: str | Path,
    *,
    password: str | None = None,
    verbose: bool = False,
    notify: Callable[[str], None] | None = None,
    max_bytes: int = DEFAULT_MAX_INPUT_SIZE,
) -> str:
    """Clean text of a .pdf/.epub/.docx/.html/.txt/.md file, of any text file, of an http(s) URL,
    or of stdin when `source` is "-". A pipe or FIFO is read as a stream; no more than `max_bytes`
    is read of any input.

    The content decides, not the name: PDF bytes are read as a PDF whatever the suffix (so
    `cat a.pdf | summarize -` works), a ZIP archive as an EPUB or a Word file by what it holds, a
    page that starts as HTML (<!DOCTYPE html>, <html>) as a web page: its main text only. EPUB
    chapters and headings of Word and HTML come as Markdown `#` lines. pypdf's warnings reach the
    terminal only when `verbose`.
    Text is UTF-8 unless a BOM says UTF-16/UTF-32; bytes that are not UTF-8 are read as
    Windows-1252, and a one-line note naming the input says so: it goes to `notify` (the CLI's
    `Reporter.note`), or is a warning when there is none. Markdown (.md) loses its code blocks,
    fenced or indented: they are not prose. Raises ExtractionError (one line, naming the input)
    for anything that yields no text, and for Markdown that is only code.

    Output contract, shared with `clean_text`: NFC Unicode; paragraphs separated by one
    blank line ("\\n\\n"); the lines of a paragraph joined by single spaces, with words hyphenated
    across line breaks rejoined; no ligature characters, soft hyphens or zero-width spaces; no
    running headers/footers or page numbers where pages are known (PDF pages, or form feeds in text).
    """
    return extract_document(source, password=password, verbose=verbose, notify=notify, max_bytes=max_bytes).text


def extract_document(
    source: str | Path,
    *,
    password: str | None = None,
    verbose: bool = False,
    notify: Callable[[str], None] | None = None,
    max_bytes: int = DEFAULT_MAX_INPUT_SIZE,
) -> Document:
    """`extract_text`'s text, with where each part of it came from (`document_from_bytes`)."""
    data = read_input(source, max_bytes=max_bytes)
    return document_from_bytes(data, source, password=password, verbose=verbose, notify=notify)


def read_input(source: str | Path, *, max_bytes: int = DEFAULT_MAX_INPUT_SIZE) -> bytes:
    """The bytes of a file, of stdin ("-") or of an http(s) URL; ExtractionError (one line naming
    the input) for a missing, empty, unreadable, unreachable, binary or too large one."""
    if is_url(source):
        return read_url(str(source), max_bytes=max_bytes)
    return read_local_input(source, max_bytes=max_bytes)


def text_from_bytes(
    data: bytes,
    source: str | Path,
    *,
    password: str | None = None,
    verbose: bool = False,
    notify: Callable[[str], None] | None = None,
) -> str:
    """`extract_text` of bytes already read from `source` (which names the input and, by its
    suffix, says whether it is Markdown or HTML): a process without access to the file can read it."""
    return document_from_bytes(data, source, password=password, verbose=verbose, notify=notify).text


def document_from_bytes(
    data: bytes,
    source: str | Path,
    *,
    password: str | None = None,
    verbose: bool = False,
    notify: Callable[[str], None] | None = None,
) -> Document:
    """`text_from_bytes`'s text and its places (inputs/places.py): the pages of a PDF or of text
    with form feeds; the chapters of an EPUB book; the sections under headings of anything else
    with headings; else the lines of a text file, the paragraphs of a Word file or a web page."""
    stdin = str(source) == STDIN
    label = STDIN_LABEL if stdin else str(source)
    suffix = "" if stdin else url_suffix(str(source)) if is_url(source) else Path(source).suffix.lower()
    notes: list[str] = []
    try:
        with _quiet_readers(verbose):
            if looks_like_pdf(data) or suffix == ".pdf":
                kind = None if looks_like_pdf(data) else known_kind(data)
                if kind is not None:
                    raise ExtractionError(f"{label}: {kind}, not a PDF")
                text, pages = _pdf_text(_iter_pages(io.BytesIO(data), label, password, notes), label)
                places = aligned(PAGE, pages, text)
            elif looks_like_zip(data) or suffix in ZIPPED_SUFFIXES:
                chapters = _zipped_text(data, label)
                text = clean_text("\n\n".join(chapter for _, chapter in chapters))
                # a book's chapters are its sections, named by their titles (or numbers)
                places = (aligned(SECTION, [chapter.translate(_TRANSLATE) for _, chapter in chapters], text,
                                  [title or str(number) for number, (title, _) in enumerate(chapters, start=1)])
                          if len(chapters) > 1 else sections(text) or paragraphs(text))
            elif suffix in HTML_SUFFIXES or looks_like_html(data):
                text = clean_text(html_main_text(data, label, notes))
                places = sections(text) or paragraphs(text)
            else:
                decoded = _decode(data, label, notes)
                if suffix in MARKDOWN_SUFFIXES:
                    decoded = _markdown_prose(decoded, label)
                text, pages = _clean(decoded)
                places = (aligned(PAGE, pages, text) if pages is not None
                          else sections(text) or lines(decoded.translate(_TRANSLATE), text))
    finally:
        for note in notes:  # said even when the input then fails: it may be why
            if notify is None:
                warnings.warn(note, stacklevel=2)
            else:
                notify(note)
    if not text:
        raise ExtractionError(f"{label}: no text found")
    return Document(text, places)


def _zipped_text(data: bytes, label: str) -> list[tuple[str | None, str]]:
    """An EPUB's chapters (title, text) or a Word file's text (as one untitled chapter), told apart
    by what the archive holds."""
    if not looks_like_zip(data):
        raise ExtractionError(f"{label}: not a ZIP archive, as EPUB and Word (.docx) files are")
    archive = Archive(data, label)
    if is_epub(archive):
        return epub_chapters(archive)
    if is_docx(archive):
        return [(None, docx_text(archive))]
    raise ExtractionError(f"{label}: a ZIP archive, not an EPUB or a Word (.docx) file")


@contextlib.contextmanager
def _quiet_readers(verbose: bool) -> Iterator[None]:
    """Keep pypdf's and trafilatura's log lines and warnings about harmless defects off the terminal."""
    if verbose:
        yield
        return
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    old_levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, old_levels):
            logger.setLevel(level)


# ---------------------------------------------------------------------------------------------
# Text decoding (reading the bytes: read_bytes.py)
# ---------------------------------------------------------------------------------------------

# Past this share of bad characters in its first SNIFF_CHARS (see _refuse_binary), a file is
# binary data. Random bytes score about 0.3 (0.5 with NULs, which are refused on sight).
BINARY_BAD_RATIO = 0.2
SNIFF_CHARS = 65536


# A BOM names the encoding; UTF-32 first, since its little-endian BOM starts like UTF-16's.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
# surrogateescape turns each byte that is not UTF-8 into U+DC80..U+DCFF: these tables read it
# as Windows-1252, or as Latin-1 where Windows-1252 leaves the byte undefined (0x81, 0x8D, ...).
_ESCAPED = re.compile("[\udc80-\udcff]")
_ESCAPED_AS_CP1252 = {0xDC00 + b: bytes([b]).decode("cp1252", errors="ignore") or chr(b) for b in range(0x80, 0x100)}
_ESCAPED_AS_LATIN1 = {0xDC00 + b: chr(b) for b in range(0x80, 0x100)}
# Accented letters are what single-byte text is made of; random bytes are mostly not letters.
_UNREADABLE = re.compile("[%s]" % "".join(chr(c) for c, r in _ESCAPED_AS_CP1252.items() if not r.isalpha()))


def _decode(data: bytes, label: str, notes: list[str]) -> str:
    """Bytes to text: the BOM's encoding, else UTF-8, with bytes that are not UTF-8 read as
    Windows-1252 (and a note appended to `notes`); never a silent U+FFFD. Binary refused.

    A file with fewer valid UTF-8 sequences than invalid bytes is a single-byte file and is
    read whole as Windows-1252; otherwise it is UTF-8 with a few stray bytes.
    """
    for bom, codec in _BOMS:
        if data.startswith(bom):
            text = data[len(bom) :].decode(codec, errors="replace")
            _refuse_binary(text, label)
            bad = text.count("\ufffd")
            if bad:
                notes.append(f"{label}: {bad} invalid {codec.upper()} sequences replaced by U+FFFD")
            return text
    codec = utf16_without_bom(data)
    if codec is not None:
        text = data.decode(codec, errors="replace")
        _refuse_binary(text, label)
        return text
    if b"\x00" in data:  # never in UTF-8 text, always in executables, images, archives
        raise ExtractionError(f"{label}: binary data, not a PDF or a text file")
    data = data.removeprefix(codecs.BOM_UTF8)
    text = data.decode("utf-8", errors="surrogateescape")
    _refuse_binary(text, label)
    bad = _escaped(text)
    if not bad:
        return text
    valid = len(text) - len(text.encode("ascii", errors="ignore")) - bad  # non-ASCII UTF-8 sequences
    if valid < bad:
        text = data.decode("cp1252", errors="surrogateescape").translate(_ESCAPED_AS_LATIN1)
        notes.append(f"{label}: not UTF-8; read as Windows-1252")
    else:
        text = text.translate(_ESCAPED_AS_CP1252)
        notes.append(f"{label}: {bad} byte(s) not UTF-8; read as Windows-1252")
    return text


def _escaped(text: str) -> int:
    return len(text) - len(_ESCAPED.sub("", text))


def _refuse_binary(text: str, label: str) -> None:
    """Past BINARY_BAD_RATIO of replacement characters, bytes that Windows-1252 reads as no
    letter, and control characters in its first SNIFF_CHARS, a "text" is binary data."""
    sample = text[:SNIFF_CHARS]
    bad = sample.count("\ufffd") + len(_UNREADABLE.findall(sample)) + len(_CONTROL_CHARS.findall(sample))
    if bad > BINARY_BAD_RATIO * len(sample):
        raise ExtractionError(f"{label}: binary data, not a PDF or a text file")


# ---------------------------------------------------------------------------------------------
# Markdown: code is not prose
# ---------------------------------------------------------------------------------------------

_FENCE = re.compile(r"[ \t]*(`{3,}|~{3,})(.*)")
_LIST_ITEM = re.compile(r"[ \t]*(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)")
_ATX_HEADING = re.compile(r"[ \t]{0,3}#{1,6}(?:[ \t]|$)")
CODE_INDENT = 4  # columns of indentation that make a line (after a blank line) code


def _markdown_prose(text: str, label: str) -> str:
    """`text` with its code blocks (``` or ~~~ fences, lines indented by CODE_INDENT columns
    after a blank line, outside lists) replaced by blank lines. Raises ExtractionError when it
    had code and nothing is left but headings."""
    out: list[str] = []
    fence = ""  # the opening fence while inside a fenced block
    had_code = in_indented = in_list = False
    paragraph_open = False  # a prose line just before: indented lines continue it
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                fence = ""
            out.append("")
            continue
        indent = len(line.expandtabs(CODE_INDENT)) - len(line.expandtabs(CODE_INDENT).lstrip())
        if not stripped:
            paragraph_open = False
            out.append("")
            continue
        if indent >= CODE_INDENT and (in_indented or not paragraph_open) and not in_list:
            had_code = in_indented = True
            out.append("")
            continue
        in_indented = False
        opening = _FENCE.match(line)
        # A backtick fence's info string has no backticks: "```a``` b" is inline code.
        if opening and (indent < CODE_INDENT or in_list) and not (opening[1][0] == "`" and "`" in opening[2]):
            fence, had_code, paragraph_open = opening[1], True, False
            out.append("")
            continue
        if _LIST_ITEM.match(line):
            in_list = True
        elif indent == 0 and not paragraph_open:
            in_list = False
        paragraph_open = not _ATX_HEADING.match(line)
        out.append(line)
    if had_code and all(not line.strip() or _ATX_HEADING.match(line) for line in out):
        raise ExtractionError(f"{label}: no prose to summarize (only code)")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# PDF
# ---------------------------------------------------------------------------------------------


def iter_pdf_pages(path: str | Path, *, password: str | None = None) -> Iterator[str]:
    """Yield the text of each page of a PDF, one page at a time.

    Within a page, lines are separated by "\\n" and paragraphs (told apart by vertical gaps
    and short last lines) by a blank line. Headers, footers and hyphenation are left in: they
    need all pages, see `extract_text`. Raises ExtractionError; does not silence pypdf.
    """
    label = str(path)
    yield from _iter_pages(io.BytesIO(read_file(Path(path), label)), label, password)


# pypdf's text extraction costs time in proportion to a page's content stream, and a crafted one
# costs minutes a megabyte: a page of text takes tens of KB, one of dense vector art a few hundred.
MAX_PAGE_CONTENT = 1 << 20
MAX_DOCUMENT_CONTENT = 64 << 20  # 500 pages of 128 KB


def _iter_pages(source: BinaryIO, label: str, password: str | None, notes: list[str] | None = None) -> Iterator[str]:
    """Each page's text; a page over the work bounds yields "" and a note in `notes` saying why."""
    reader = _open_pdf(source, label, password)
    budget = MAX_DOCUMENT_CONTENT
    for number, page in enumerate(reader.pages, start=1):
        try:
            content = page.get_contents()
            size = 0 if content is None else len(content.get_data())
            if size > min(MAX_PAGE_CONTENT, budget):
                too_much = (f"its content is {format_size(size)}, over the {format_size(MAX_PAGE_CONTENT)} "
                            "a page may take" if size > MAX_PAGE_CONTENT else
                            f"the document's pages have taken the {format_size(MAX_DOCUMENT_CONTENT)} it may take")
                if notes is not None:
                    notes.append(f"{label}: page {number} skipped: {too_much}")
                yield ""
                continue
            budget -= size
            text = _page_text(page)
        except Exception as exc:  # pypdf raises many kinds on damaged content streams
            raise ExtractionError(f"{label}: page {number} is damaged ({first_line(exc)[:160]})") from exc
        yield text


def _open_pdf(source: BinaryIO, label: str, password: str | None) -> PdfReader:
    try:
        reader = PdfReader(source)  # strict=False: tolerate the small defects of real PDFs
        if reader.is_encrypted:
            _decrypt(reader, label, password)
        if len(reader.pages) == 0:
            raise ExtractionError(f"{label}: the PDF has no pages")
    except ExtractionError:
        raise
    except EmptyFileError as exc:
        raise ExtractionError(f"{label}: the file is empty") from exc
    except DependencyError as exc:
        raise ExtractionError(f"{label}: {first_line(exc)[:160]}") from exc
    except Exception as exc:  # PdfReadError, but also ValueError, KeyError, ... on bad files
        raise ExtractionError(
            f"{label}: not a readable PDF, damaged or truncated ({first_line(exc)[:160]})"
        ) from exc
    return reader


def _decrypt(reader: PdfReader, label: str, password: str | None) -> None:
    # Many "encrypted" PDFs only restrict printing/copying and open with the empty password.
    if reader.decrypt("") != PasswordType.NOT_DECRYPTED:
        return
    if password is None:
        raise ExtractionError(f"{label}: the PDF is encrypted; pass --password")
    if reader.decrypt(password) == PasswordType.NOT_DECRYPTED:
        raise ExtractionError(f"{label}: wrong password for the encrypted PDF")



def _pdf_text(pages: Iterator[str], label: str) -> tuple[str, list[str]]:
    """Hold the pages once (the edge lines need them all), strip furniture in place, reflow; the
    text and the pages it was made of."""
    page_texts = [_normalise_chars(page.replace("\f", "\n")) for page in pages]
    if not any(page.strip() for page in page_texts):
        raise ExtractionError(f"{label}: the PDF has no text layer (scanned?); OCR is not supported")
    _drop_page_furniture(page_texts)
    return _finish(_reflow(_join_pages(page_texts))), page_texts


# PDFs have no paragraph marks. A step down between baselines, in font sizes, larger than
# PARAGRAPH_GAP_FACTOR times the page's typical step (its TYPICAL_STEP_QUANTILE, low so that
# pages of one-line items still show their line spacing) ends a paragraph; so does a line that
# ends a sentence and is shorter than SHORT_LINE_RATIO of the typical line (LaTeX indents
# paragraphs instead of spacing them). Steps under MIN_STEP font sizes are sub/superscripts or
# inline maths, and a line in type under SMALL_TYPE of the size of the line before it is a
# superscript: neither is a baseline to measure the next step from.
PARAGRAPH_GAP_FACTOR = 1.3
TYPICAL_STEP_QUANTILE = 0.25
SHORT_LINE_RATIO = 0.7
MIN_STEP = 0.9
SMALL_TYPE = 0.75  # superscripts are ~0.7 of the text size, footnotes ~0.8
_SENTENCE_END = re.compile(r"[.!?…:;][\"')\]»”’]*$")  # "end." "end.)" "end.”"


class _Line:
    __slots__ = ("text", "y", "size")

    def __init__(self) -> None:
        self.text = ""
        self.y: float | None = None  # baseline in user space, None when pypdf gives no position
        self.size = 0.0  # font size in user space


def _page_text(page: PageObject) -> str:
    """pypdf's plain-mode text with paragraph breaks recovered from the baselines of lines."""
    lines = [_Line()]

    def visit(text: str, cm: list[float], tm: list[float], _font: object, size: float) -> None:
        for i, piece in enumerate(text.split("\n")):
            if i:
                lines.append(_Line())
            line = lines[-1]
            if i == 0 and line.y is None and piece.strip():
                line.y = tm[4] * cm[1] + tm[5] * cm[3] + cm[5]
                scale = abs((tm[0] * tm[3] - tm[1] * tm[2]) * (cm[0] * cm[3] - cm[1] * cm[2]))
                line.size = size * math.sqrt(scale)
            line.text += piece

    page.extract_text(visitor_text=visit)
    lines = [line for line in lines if line.text.strip()]
    if not lines:
        return ""
    steps = [_line_step(lines, i) for i in range(len(lines))]
    known = sorted(step for step in steps if step is not None)
    typical_step = known[int(TYPICAL_STEP_QUANTILE * (len(known) - 1))] if known else math.inf
    typical_len = sorted(len(line.text) for line in lines)[len(lines) // 2]
    out = [lines[0].text]
    for i in range(1, len(lines)):
        prev_text = lines[i - 1].text.rstrip()
        gap_break = (steps[i] or 0.0) > PARAGRAPH_GAP_FACTOR * typical_step
        short_end = len(prev_text) < SHORT_LINE_RATIO * typical_len and _ends_sentence(prev_text)
        out.append("\n\n" if gap_break or short_end else "\n")
        out.append(lines[i].text)
    return "".join(out)


def _line_step(lines: list[_Line], i: int) -> float | None:
    """The step down to line i from the baseline above it, in line i's font sizes (1.2 for
    10 pt type on 12 pt leading); None when it is no line step: a jump up (a new column,
    out-of-order text), a sub/superscript shift, or no position known."""
    line, above = lines[i], None
    for j in range(i - 1, max(-1, i - 4), -1):  # skip a superscript or two
        if lines[j].y is not None and not (j and lines[j].size < SMALL_TYPE * lines[j - 1].size):
            above = lines[j]
            break
    if above is None or line.y is None:
        return None
    step = (above.y - line.y) / (line.size or 1.0)  # type: ignore[operator]
    return step if step >= MIN_STEP else None


def _ends_sentence(text: str) -> bool:
    return _SENTENCE_END.search(text.rstrip()[-8:]) is not None


# ---------------------------------------------------------------------------------------------
# Page furniture: running headers/footers and page numbers
# ---------------------------------------------------------------------------------------------

EDGE_LINES = 2  # how many lines at the top and at the bottom of a page may be furniture
MIN_REPEATS = 3  # an edge line repeated on this many pages is a running header/footer
# Edge lines that start or end with the page's own number, printed page = index + a constant
# offset on at least this share of pages, are running headers even when their text changes
# from section to section ("Chapter 5: Linking 6").
PAGE_NUMBER_SHARE = 0.5
_DIGITS = re.compile(r"\d+")
_PAGE_NUMBER = re.compile(
    r"(?:page|p\.|pg\.?)?\s*[-–—(\[]?\s*"
    r"(?:#|(?=[ivxlcdm])m{0,3}(?:cm|cd|d?c{0,3})(?:xc|xl|l?x{0,3})(?:ix|iv|v?i{0,3}))"
    r"\s*(?:(?:of|/)\s*#)?\s*[-–—)\]]?"
)
_TOKEN_PUNCTUATION = "-–—|.,:;()[]"


def _edge_key(line: str) -> str:
    """What stays the same between pages: "Page 3 of 10" and "Page 4 of 10" share one key."""
    return _DIGITS.sub("#", " ".join(line.split()).casefold())


def _is_page_number(key: str) -> bool:
    return bool(key) and _PAGE_NUMBER.fullmatch(key) is not None


def _end_numbers(line: str) -> set[int]:
    """The numbers a line starts or ends with: where running headers print the page number."""
    tokens = [token.strip(_TOKEN_PUNCTUATION) for token in line.split()]
    tokens = [token for token in tokens if token]
    ends = {tokens[0], tokens[-1]} if tokens else set()
    return {int(token) for token in ends if token.isascii() and token.isdigit() and len(token) < 6}


def _edge_lines(page: str) -> list[str]:
    lines = [line for line in page.split("\n") if line.strip()]
    return lines[:EDGE_LINES] + lines[EDGE_LINES:][-EDGE_LINES:]


def _drop_page_furniture(pages: list[str]) -> None:
    """Remove, in place, edge lines that repeat across pages or carry the page number."""
    if not pages:
        return
    keys: Counter[str] = Counter()  # pages whose edges hold a line with this key
    offsets: Counter[int] = Counter()  # pages whose edges hold their number + this offset
    for index, page in enumerate(pages):
        edges = _edge_lines(page)
        keys.update({_edge_key(line) for line in edges})
        offsets.update({n - index for line in edges for n in _end_numbers(line)})
    needed = min(MIN_REPEATS, len(pages)) if len(pages) > 1 else math.inf
    repeated = {key for key, count in keys.items() if count >= needed}
    if repeated:  # a header lives at the edges; a line of text repeated in the body does not
        inside = Counter(
            key
            for page in pages
            for line in [line for line in page.split("\n") if line.strip()][EDGE_LINES:-EDGE_LINES]
            if (key := _edge_key(line)) in repeated
        )
        repeated = {key for key in repeated if inside[key] < keys[key]}
    offset, count = offsets.most_common(1)[0] if offsets else (None, 0)
    if count < max(needed, PAGE_NUMBER_SHARE * len(pages)):
        offset = None

    def furniture(line: str, index: int) -> bool:
        key = _edge_key(line)
        if key in repeated or _is_page_number(key):
            return True
        return offset is not None and index + offset in _end_numbers(line)

    for index, page in enumerate(pages):
        lines = page.split("\n")
        content = [j for j, line in enumerate(lines) if line.strip()]
        drop = set()
        # Walk in from each edge and stop at the first real line, so body text is never cut.
        for order in (content[:EDGE_LINES], content[::-1][:EDGE_LINES]):
            for j in order:
                if not furniture(lines[j], index):
                    break
                drop.add(j)
        if len(drop) == len(content):  # never empty a page that holds nothing else: its text is the text
            drop = {j for j in drop if _is_page_number(_edge_key(lines[j]))}
        if drop:
            pages[index] = "\n".join(line for j, line in enumerate(lines) if j not in drop)


def _join_pages(pages: list[str]) -> str:
    """A page whose last line is full and does not end a sentence continues its paragraph on
    the next page; otherwise the next page starts a new one."""
    parts: list[str] = []
    ends_paragraph = True
    for page in pages:
        lines = [line.strip() for line in page.split("\n") if line.strip()]
        if not lines:
            continue
        if parts:
            parts.append("\n\n" if ends_paragraph else "\n")
        parts.append(page.strip("\n"))
        typical_len = sorted(map(len, lines))[len(lines) // 2]
        last = lines[-1]
        ends_paragraph = _ends_sentence(last) or len(last) < SHORT_LINE_RATIO * typical_len
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# Clean-up of text
# ---------------------------------------------------------------------------------------------

_LIGATURES = {"ﬀ": "ff", "ﬁ": "fi", "ﬂ": "fl", "ﬃ": "ffi", "ﬄ": "ffl", "ﬅ": "st", "ﬆ": "st"}
# Soft hyphen, zero-width space, word joiner, BOM. ZWJ/ZWNJ stay: they change the meaning of
# Persian and Indic words and of emoji.
_INVISIBLE = "\u00ad\u200b\u2060\ufeff"
_NEWLINES = {"\r\n": "\n", "\r": "\n", "\x0b": "\n", "\x85": "\n", "\u2028": "\n", "\u2029": "\n\n"}
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f]")
_TRANSLATE = str.maketrans({**_LIGATURES, **{c: "" for c in _INVISIBLE}})
_NEWLINE_RE = re.compile("|".join(map(re.escape, _NEWLINES)))
_SOFT_HYPHEN_BREAK = re.compile(r"\u00ad[^\S\n]*\n[^\S\n]*(?=\S)")
_SPACES = re.compile(r"[^\S\n\f]+")
_DOT_LEADERS = re.compile(r" ?\.(?: ?\.){3,} ?")  # ". . . . 12" in tables of contents
_BLANK_LINES = re.compile(r"\n\s*\n")
# A line that starts a list item or a Markdown heading starts a new paragraph.
_BLOCK_START = re.compile(r"(?:[-*+•◦‣▪●○]|#{1,6})\s")
_HEADING = re.compile(r"#{1,6}\s")
# "exam-" + "ple": letters, then a hyphen ending the line ("--" and " -" are dashes, not breaks).
_BROKEN_HEAD = re.compile(r"(?<![^\W\d_])([^\W\d_]+)-$")
_WORD = re.compile(r"[^\W\d_]+")
_COMPOUND = re.compile(r"(?<![^\W\d_])([^\W\d_]+)-(?=([^\W\d_]+))")


def clean_text(text: str) -> str:
    """Clean any text (the contract of `extract_text`); idempotent. Form feeds are read as page breaks."""
    return _clean(text)[0]


def _clean(text: str) -> tuple[str, list[str] | None]:
    """`clean_text`'s text, and the pages it was made of where form feeds mark them."""
    text = _normalise_chars(text)
    pages = None
    if "\f" in text:
        pages = text.split("\f")
        _drop_page_furniture(pages)
        text = _join_pages(pages)
    return _finish(_reflow(text)), pages


def _normalise_chars(text: str) -> str:
    text = _NEWLINE_RE.sub(lambda m: _NEWLINES[m.group()], text)
    text = _SOFT_HYPHEN_BREAK.sub("", text)  # a soft hyphen at a line end marks a word break
    text = _CONTROL_CHARS.sub("", text.translate(_TRANSLATE))
    return unicodedata.normalize("NFC", _SPACES.sub(" ", text))


def _finish(text: str) -> str:
    # Joining lines can bring composable characters together (e.g. Hangul jamo), so NFC again.
    return text if unicodedata.is_normalized("NFC", text) else unicodedata.normalize("NFC", text)


def _reflow(text: str) -> str:
    """Blank lines separate paragraphs; the lines of a paragraph are joined."""
    compounds = _known_compounds(text) if "-\n" in text else set()
    paragraphs = []
    for block in _BLANK_LINES.split(text):
        current: list[str] = []
        for line in block.split("\n"):
            line = line.strip()
            if not line:
                continue
            if current and (_BLOCK_START.match(line) or _HEADING.match(current[0])):
                paragraphs.append(_join_lines(current, compounds))
                current = []
            current.append(line)
        if current:
            paragraphs.append(_join_lines(current, compounds))
    return "\n\n".join(paragraphs)


def _known_compounds(text: str) -> set[str]:
    """Hyphenated words the text writes unbroken, e.g. "well-known": their breaks keep the hyphen."""
    return {f"{m.group(1)}-{m.group(2)}".casefold() for m in _COMPOUND.finditer(text)}


def _join_lines(lines: list[str], compounds: set[str]) -> str:
    parts = [lines[0]]
    for line in lines[1:]:
        head = _BROKEN_HEAD.search(parts[-1])
        if head is None or not line[0].isalnum():
            parts.append(" ")
        elif line[0].islower():
            compound = f"{head.group(1)}-{_WORD.match(line).group()}".casefold()  # type: ignore[union-attr]
            if compound not in compounds:
                parts[-1] = parts[-1][:-1]  # "exam-" + "ple" -> "example"
        # else "Jean-" + "Paul", "COVID-" + "19": keep the hyphen, add no space
        parts.append(line)
    # Dot leaders are collapsed only now: a line break can fall inside them.
    return _DOT_LEADERS.sub(" … ", "".join(parts)).strip()

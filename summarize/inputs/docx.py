"""The text of a Word document (.docx, Office Open XML): its paragraphs in order, headings as
Markdown `#` lines, each table row as one paragraph of cells joined by " | ". The body is
word/document.xml; word/styles.xml says which paragraph styles are headings (by name, "heading 1",
or by outline level, so that styles renamed in other languages count too).
"""

from __future__ import annotations

import re
from xml.etree.ElementTree import Element

from summarize.inputs.archive import Archive
from summarize.inputs.markup import CELL_SEPARATOR

DOCUMENT = "word/document.xml"
STYLES = "word/styles.xml"
W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
MAX_HEADING_LEVEL = 6
_HEADING_NAME = re.compile(r"heading\s*([1-9])", re.IGNORECASE)
_LINE_BREAKS = {f"{W}br", f"{W}cr"}


def is_docx(archive: Archive) -> bool:
    return DOCUMENT in archive.names


def docx_text(archive: Archive) -> str:
    """Paragraphs separated by blank lines."""
    body = archive.xml(DOCUMENT).find(f"{W}body")
    levels = _heading_levels(archive) if STYLES in archive.names else {}
    paragraphs: list[str] = []
    if body is not None:
        _read_blocks(body, levels, paragraphs)
    return "\n\n".join(paragraphs)


def _read_blocks(parent: Element, levels: dict[str, int], out: list[str]) -> None:
    for block in parent:
        if block.tag == f"{W}p":
            text = _paragraph_text(block)
            level = _paragraph_level(block, levels)
            if text.strip():
                out.append(f"{'#' * level} {text}" if level else text)
        elif block.tag == f"{W}tbl":
            for row in block.iterfind(f"{W}tr"):
                cells = [" ".join(_paragraph_text(p) for p in cell.iter(f"{W}p")) for cell in row.iterfind(f"{W}tc")]
                if any(cell.strip() for cell in cells):
                    out.append(CELL_SEPARATOR.join(" ".join(cell.split()) for cell in cells))
        elif block.tag == f"{W}sdt":  # a content control: its content is ordinary blocks
            for content in block.iterfind(f"{W}sdtContent"):
                _read_blocks(content, levels, out)


def _paragraph_text(paragraph: Element) -> str:
    """w:t runs (deleted text is w:delText and is left out), tabs as spaces, breaks as line ends."""
    parts = []
    for node in paragraph.iter():
        if node.tag == f"{W}t":
            parts.append(node.text or "")
        elif node.tag == f"{W}tab":
            parts.append(" ")
        elif node.tag in _LINE_BREAKS:
            parts.append("\n")
    return "".join(parts)


def _paragraph_level(paragraph: Element, levels: dict[str, int]) -> int:
    """The paragraph's heading level, 0 for body text: its own outline level, else its style's."""
    outline = paragraph.find(f"{W}pPr/{W}outlineLvl")
    if outline is not None:
        return _outline_level(outline)
    style = paragraph.find(f"{W}pPr/{W}pStyle")
    if style is None:
        return 0
    style_id = style.get(f"{W}val", "")
    if style_id in levels:
        return levels[style_id]
    named = _HEADING_NAME.fullmatch(style_id)  # no styles.xml: Word's own ids, "Heading1"
    return min(int(named[1]), MAX_HEADING_LEVEL) if named else int(style_id == "Title")


def _heading_levels(archive: Archive) -> dict[str, int]:
    """Paragraph style id → heading level, for the styles that are headings."""
    levels = {}
    for style in archive.xml(STYLES).iterfind(f"{W}style"):
        name_node, outline = style.find(f"{W}name"), style.find(f"{W}pPr/{W}outlineLvl")
        name = "" if name_node is None else name_node.get(f"{W}val", "")
        named = _HEADING_NAME.fullmatch(name.strip())
        level = (min(int(named[1]), MAX_HEADING_LEVEL) if named else int(name.strip().casefold() == "title")) or (
            _outline_level(outline) if outline is not None else 0)
        if level:
            levels[style.get(f"{W}styleId", "")] = level
    return levels


def _outline_level(node: Element) -> int:
    """w:outlineLvl counts from 0; 9 means body text."""
    value = node.get(f"{W}val", "")
    return min(int(value) + 1, MAX_HEADING_LEVEL) if value.isdigit() and int(value) < 9 else 0

"""Build samples/target-tier-policy.pdf from samples/target-tier-policy.txt with fpdf2.

The PDF is laid out to exercise the extractor the way real documents do: a title and section
headings, list items, running headers that alternate between even and odd pages and carry the
page number, "Page N of M" footers, paragraphs running across pages, and long words
hyphenated at line ends (so the text layer has "-\\n" breaks). A fixed creation date makes the
output reproducible for a given fpdf2 version.

    python scripts/make_sample_pdf.py [SOURCE.txt] [OUT.pdf]

fpdf2 is a development dependency (the `test` extra); the package itself never imports it.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from datetime import datetime, timezone
from pathlib import Path

from fpdf import FPDF

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "samples" / "target-tier-policy.txt"
OUTPUT = ROOT / "samples" / "target-tier-policy.pdf"

TITLE = "Target Tier Policy"
BOOK = "The rustc book"
CREATED = datetime(2025, 1, 1, tzinfo=timezone.utc)

# Page geometry in mm (A4).
MARGIN = 25.0
TOP = 25.0
BOTTOM = 272.0
BODY_SIZE, BODY_LEADING = 11, 5.4
PARAGRAPH_SPACE = 2.6  # extra space between paragraphs: what the extractor detects
LIST_INDENT, BULLET_GAP = 6.0, 4.0
MIN_HYPHENATED = 7  # only words at least this long are split, leaving >= 3 letters per side

# The core fonts only encode Latin-1: map the typographic characters the source uses.
TRANSLITERATION = str.maketrans(
    {"“": '"', "”": '"', "‘": "'", "’": "'", "—": "--", "–": "-", "…": "...", "\u00a0": " "}
)
VOWELS = set("aeiouy")


def to_latin1(text: str) -> str:
    text = text.translate(TRANSLITERATION)
    if all(ord(c) < 256 for c in text):
        return text
    decomposed = unicodedata.normalize("NFKD", text)  # "ő" -> "o" + accent, then drop the accent
    return "".join(c for c in decomposed if ord(c) < 256 and not unicodedata.combining(c))


class SamplePDF(FPDF):
    def header(self) -> None:
        if self.page_no() == 1:  # title pages carry no running header
            return
        self.set_font("Helvetica", "I", 8.5)
        self.set_text_color(90)
        page = self.page_no()
        if page % 2 == 0:
            self.text(MARGIN, 14, f"{page}  |  {BOOK}")
        else:
            label = f"{TITLE}  |  {page}"
            self.text(self.w - MARGIN - self.get_string_width(label), 14, label)
        self.set_draw_color(160)
        self.line(MARGIN, 16, self.w - MARGIN, 16)
        self.set_text_color(0)

    def footer(self) -> None:
        self.set_font("Helvetica", "", 8.5)
        self.set_xy(MARGIN, 281)
        # cell(), unlike text(), substitutes the "{nb}" alias with the page count
        self.cell(self.w - 2 * MARGIN, 6, f"Page {self.page_no()} of {{nb}}", align="C")


def parse_blocks(text: str) -> list[tuple[str, int, str]]:
    """(kind, level, text) for each blank-line separated block: title, heading, item, para."""
    blocks = []
    for number, raw in enumerate(re.split(r"\n\s*\n", text.strip())):
        indent = len(raw) - len(raw.lstrip(" "))
        joined = " ".join(raw.split())
        if number == 0:
            blocks.append(("title", 0, joined))
        elif joined.startswith("- "):
            blocks.append(("item", indent // 2 + 1, joined[2:]))
        elif indent == 0 and "\n" not in raw and len(joined) < 60 and joined[-1].isalnum():
            blocks.append(("heading", 0, joined))
        else:  # a paragraph, possibly continuing a list item at its indent
            blocks.append(("para", indent // 2, joined))
    return blocks


def split_word(pdf: FPDF, word: str, room: float) -> tuple[str, str] | None:
    """Split a long word so that `head + "-"` fits in `room`; prefer a vowel-consonant seam."""
    match = re.fullmatch(r"([A-Za-z][a-z]+)([,.;:)]*)", word)
    if not match or len(match.group(1)) < MIN_HYPHENATED:
        return None
    core, punct = match.groups()
    cuts = [k for k in range(len(core) - 3, 2, -1) if pdf.get_string_width(core[:k] + "-") <= room]
    if not cuts:
        return None

    def seam(k: int) -> int:  # 0 "documen-tation" (VC-CV), 1 "require-ments" (V-CV), 2 other
        v = [c in VOWELS for c in core[k - 2 : k + 2]]
        return 0 if v == [True, False, False, True] else 1 if v[1:] == [True, False, True] else 2

    k = min(cuts, key=seam)  # the longest head among the best seams: cuts run long to short
    return core[:k], core[k:] + punct


def wrap(pdf: FPDF, text: str, width: float) -> list[str]:
    """Greedy line filling that hyphenates a long word rather than leave a wide gap."""
    words, lines, line = text.split(), [], ""
    while words:
        word = words.pop(0)
        candidate = f"{line} {word}" if line else word
        if pdf.get_string_width(candidate) <= width:
            line = candidate
            continue
        room = width - pdf.get_string_width(f"{line} " if line else "")
        parts = split_word(pdf, word, room)
        if parts:
            lines.append(f"{line} {parts[0]}-" if line else f"{parts[0]}-")
            words.insert(0, parts[1])
            line = ""
        elif line:
            lines.append(line)
            words.insert(0, word)
            line = ""
        else:  # a single word wider than the line
            lines.append(word)
    if line:
        lines.append(line)
    return lines


def render(blocks: list[tuple[str, int, str]]) -> SamplePDF:
    pdf = SamplePDF(format="A4", unit="mm")
    pdf.set_auto_page_break(False)  # pages are broken by hand, line by line
    pdf.set_creation_date(CREATED)
    pdf.set_title(TITLE)
    pdf.set_author("The Rust Project Developers")
    pdf.set_subject("Sample document for the summarize test suite")
    pdf.alias_nb_pages()  # "{nb}" in the footer becomes the page count
    pdf.add_page()
    y = TOP

    def room_for(height: float) -> None:
        nonlocal y
        if y + height > BOTTOM:
            pdf.add_page()
            y = TOP

    for kind, level, text in blocks:
        text = to_latin1(text)
        if kind in ("title", "heading"):
            size = 18 if kind == "title" else 13
            room_for(size * 0.35 + 3 * BODY_LEADING)  # keep a heading with its first lines
            y += 0 if y == TOP else 4.0
            pdf.set_font("Helvetica", "B", size)
            y += size * 0.35
            pdf.text(MARGIN, y, text)
            y += size * 0.35 + PARAGRAPH_SPACE
            continue
        pdf.set_font("Times", "", BODY_SIZE)
        x = MARGIN + level * LIST_INDENT + (BULLET_GAP if kind == "item" else 0)
        if kind == "para" and level:
            x += BULLET_GAP - LIST_INDENT  # a list item's second paragraph aligns with its text
        for number, line in enumerate(wrap(pdf, text, pdf.w - MARGIN - x)):
            room_for(BODY_LEADING)
            y += BODY_LEADING
            if kind == "item" and number == 0:
                pdf.text(x - BULLET_GAP, y, "-")
            pdf.text(x, y, line)
        y += PARAGRAPH_SPACE
    return pdf


def main(argv: list[str]) -> None:
    source = Path(argv[1]) if len(argv) > 1 else SOURCE
    output = Path(argv[2]) if len(argv) > 2 else OUTPUT
    pdf = render(parse_blocks(source.read_text(encoding="utf-8")))
    pdf.output(str(output))
    print(f"wrote {output} ({pdf.pages_count} pages, {output.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main(sys.argv)

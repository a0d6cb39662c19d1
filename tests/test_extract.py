"""input_text: any input becomes clean text, or one clear ExtractionError line naming the input."""

from __future__ import annotations

import codecs
import io
import logging
import re
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from summarize.errors import SummarizeError
from summarize.inputs.extract import SUPPORTED_SUFFIXES, ExtractionError, clean_text, extract_text, iter_pdf_pages

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
SAMPLE_PDF = SAMPLES / "target-tier-policy.pdf"
SAMPLE_TXT = SAMPLES / "target-tier-policy.txt"
LIGATURES = "ﬀﬁﬂﬃﬄﬅﬆ"
# The sample PDF is typeset in a core font, so its maker turned these into Latin-1.
PDF_TRANSLITERATION = str.maketrans({"“": '"', "”": '"', "’": "'"})


def words(text: str) -> list[str]:
    return re.findall(r"[^\W\d_]+", text.casefold())


@pytest.fixture(scope="module")
def sample_pdf_text() -> str:
    return extract_text(SAMPLE_PDF)


@pytest.fixture
def stdin_bytes(monkeypatch: pytest.MonkeyPatch):
    def feed(data: bytes) -> None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))

    return feed


def find_unicode_font() -> Path | None:
    candidates = [Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")]
    try:
        import matplotlib

        candidates.append(Path(matplotlib.get_data_path()) / "fonts/ttf/DejaVuSans.ttf")
    except ImportError:
        pass
    return next((path for path in candidates if path.is_file()), None)


# --- the sample PDF: headers, footers, hyphenation and paragraphs -----------------------------


def test_sample_pdf_is_a_real_multi_page_document():
    pages = list(iter_pdf_pages(SAMPLE_PDF))
    assert len(pages) >= 8
    assert all(page.strip() for page in pages)
    assert "Page 2 of" in pages[1]  # the raw pages do carry the furniture...


def test_sample_pdf_has_no_running_headers_or_page_numbers(sample_pdf_text):
    assert "The rustc book" not in sample_pdf_text  # ...that the extracted text drops
    assert not re.search(r"Page \d+ of \d+", sample_pdf_text)
    assert not re.search(r"Target Tier Policy \| \d+", sample_pdf_text)
    assert not any(p.strip().isdigit() for p in sample_pdf_text.split("\n\n"))


def test_sample_pdf_words_hyphenated_at_line_ends_are_rejoined(sample_pdf_text):
    raw = "".join(iter_pdf_pages(SAMPLE_PDF))
    assert len(re.findall(r"[a-z]-\n[a-z]", raw)) > 20  # the sample does exercise this
    assert "-\n" not in sample_pdf_text
    # Every word of the extracted text is a word of the source: no "requi" + "rements".
    assert set(words(sample_pdf_text)) <= set(words(SAMPLE_TXT.read_text(encoding="utf-8")))


def test_sample_pdf_keeps_real_hyphens(sample_pdf_text):
    for compound in ("higher-tier", "target-specific", "cross-compilation"):
        assert compound in sample_pdf_text


def test_sample_pdf_keeps_paragraphs_and_headings_as_in_its_source(sample_pdf_text):
    source = clean_text(SAMPLE_TXT.read_text(encoding="utf-8")).translate(PDF_TRANSLITERATION)
    assert sample_pdf_text.split("\n\n") == source.split("\n\n")
    paragraphs = sample_pdf_text.split("\n\n")
    assert paragraphs[0] == "Target Tier Policy"
    assert "Tier 2 with host tools" in paragraphs
    assert "\n" not in sample_pdf_text.replace("\n\n", "")


def test_sample_text_and_pdf_are_small_and_documented():
    assert SAMPLE_PDF.stat().st_size < 300_000 and SAMPLE_TXT.stat().st_size < 300_000
    readme = (SAMPLES / "README.md").read_text(encoding="utf-8")
    assert SAMPLE_PDF.name in readme and SAMPLE_TXT.name in readme and "License" in readme


def test_pdf_ligatures_are_expanded(tmp_path, pdf_factory):
    font = find_unicode_font()
    if font is None:
        pytest.skip("no TrueType font with ligature glyphs on this machine")
    path = pdf_factory(tmp_path / "lig.pdf", ["The ﬁrst oﬃce ﬂoor had ﬀ and ﬄ."], font=font)
    assert extract_text(path) == "The first office floor had ff and ffl."


def test_pdf_paragraph_continues_across_pages(tmp_path, pdf_factory):
    path = pdf_factory(tmp_path / "two.pdf", ["The first page ends in the middle of a", "sentence."])
    assert extract_text(path) == "The first page ends in the middle of a sentence."


def test_iter_pdf_pages_yields_one_string_per_page_lazily():
    pages = iter_pdf_pages(SAMPLE_PDF)
    assert "Target Tier Policy" in next(pages)
    assert len(list(pages)) >= 7


# --- plain text, Markdown, stdin -----------------------------------------------------------------


def test_txt_lines_are_joined_and_paragraphs_kept(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(
        "\ufeffFirst  line of a\r\nparagraph  that was\r\nwrapped.   \r\n\r\n\r\n"
        "An exam-\r\nple, a well-known\r\ncase.\r\n".encode()
    )
    assert extract_text(path) == (
        "First line of a paragraph that was wrapped.\n\nAn example, a well-known case."
    )


def test_md_headings_and_list_items_stay_apart(tmp_path):
    path = tmp_path / "notes.md"
    path.write_text("# Title\nIntro text\ngoes on.\n\n- one\n- two\n  continued\n", encoding="utf-8")
    assert extract_text(path) == "# Title\n\nIntro text goes on.\n\n- one\n\n- two continued"


def test_sample_txt_extracts(sample_pdf_text):
    text = extract_text(SAMPLE_TXT)
    assert text.startswith("Target Tier Policy\n\nGeneral\n\nRust provides three tiers")
    assert len(text.split("\n\n")) == len(sample_pdf_text.split("\n\n"))


def test_unknown_suffix_is_read_as_text_when_it_is_text(tmp_path):
    path = tmp_path / "notes.rst"
    path.write_text("Plain\ntext.", encoding="utf-8")
    assert extract_text(path) == "Plain text."
    assert ".rst" not in SUPPORTED_SUFFIXES


def test_stdin_text(stdin_bytes):
    stdin_bytes("\ufeffcaf\u00e9 ﬁne\nline\n\nnext".encode())
    assert extract_text("-") == "café fine line\n\nnext"


def test_stdin_that_is_not_utf8_is_read_as_windows_1252_with_a_note(stdin_bytes):
    # Was: the byte became U+FFFD, silently. The issue asks for Windows-1252 and a note instead.
    stdin_bytes(b"mostly fine text with one bad byte \xff here, and more words after it")
    notes = []
    assert extract_text("-", notify=notes.append).startswith("mostly fine text with one bad byte \u00ff here")
    assert notes == ["<stdin>: not UTF-8; read as Windows-1252"]


# --- encodings: BOM, UTF-8, else Windows-1252 with a note; never a silent U+FFFD --------------------

WINDOWS_1252 = "Caf\u00e9 cr\u00e8me \u201cbr\u00fbl\u00e9e\u201d \u2013 5 \u20ac, na\u00efve \u0152uvre."


def test_a_windows_1252_file_is_read_as_such_with_a_note(tmp_path):
    path = tmp_path / "menu.txt"
    path.write_bytes(WINDOWS_1252.encode("cp1252"))
    notes = []
    text = extract_text(path, notify=notes.append)
    assert text == WINDOWS_1252 and "\ufffd" not in text
    assert notes == [f"{path}: not UTF-8; read as Windows-1252"]


def test_without_notify_the_note_is_a_warning(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("D\u00e9j\u00e0 vu, \u00e7a va.".encode("latin-1"))
    with pytest.warns(UserWarning, match="read as Windows-1252"):
        assert extract_text(path) == "D\u00e9j\u00e0 vu, \u00e7a va."


def test_bytes_windows_1252_leaves_undefined_are_read_as_latin_1_and_dropped(tmp_path):
    path = tmp_path / "odd.txt"
    path.write_bytes(b"caf\xe9 \x81and\x9d more")  # 0x81, 0x9D: C1 controls in Latin-1
    assert extract_text(path, notify=lambda note: None) == "caf\u00e9 and more"


def test_stray_bytes_in_a_utf8_file_are_read_as_windows_1252(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_bytes("na\u00efve caf\u00e9 \u65e5\u672c ".encode() + b"\x96 one stray dash")
    notes = []
    assert extract_text(path, notify=notes.append) == "na\u00efve caf\u00e9 \u65e5\u672c \u2013 one stray dash"
    assert notes == [f"{path}: 1 byte(s) not UTF-8; read as Windows-1252"]


BOMS = {"utf-16-le": codecs.BOM_UTF16_LE, "utf-16-be": codecs.BOM_UTF16_BE,
        "utf-32-le": codecs.BOM_UTF32_LE, "utf-32-be": codecs.BOM_UTF32_BE}


@pytest.mark.parametrize("codec", ["utf-8-sig", "utf-16", "utf-32", *BOMS])
def test_a_bom_names_the_encoding(tmp_path, codec):
    path = tmp_path / "bom.txt"
    path.write_bytes(BOMS.get(codec, b"") + WINDOWS_1252.encode(codec))  # the first three write their own
    notes = []
    assert extract_text(path, notify=notes.append) == WINDOWS_1252
    assert notes == []


def test_utf8_needs_no_note(tmp_path):
    path = tmp_path / "plain.txt"
    path.write_text(WINDOWS_1252, encoding="utf-8")
    notes = []
    assert extract_text(path, notify=notes.append) == WINDOWS_1252 and notes == []


# --- Markdown: code is not prose ----------------------------------------------------------------------


def test_markdown_code_blocks_are_dropped(tmp_path):
    path = tmp_path / "guide.md"
    path.write_text(
        "# Guide\n\nInstall it first.\n\n```bash\npip install tool\n\nmake all\n```\n\n"
        "Then run it:\n\n    tool --run\n    tool --check\n\n~~~~\nmore code\n~~~\nstill code\n~~~~\n\n"
        "- a list item\n\n    its second paragraph, indented\n\nThe end, with `inline code` kept.\n",
        encoding="utf-8",
    )
    assert extract_text(path) == (
        "# Guide\n\nInstall it first.\n\nThen run it:\n\n- a list item\n\n"
        "its second paragraph, indented\n\nThe end, with `inline code` kept."
    )


def test_a_line_indented_inside_a_paragraph_is_not_code(tmp_path):
    path = tmp_path / "wrapped.md"
    path.write_text("A paragraph that\n    continues on an indented line.\n", encoding="utf-8")
    assert extract_text(path) == "A paragraph that continues on an indented line."


@pytest.mark.parametrize(
    "content",
    ["```python\nprint('hi')\n```\n", "# Example\n\n```\nx = 1\n```\n\n    y = 2\n", "~~~\nunclosed fence\n"],
)
def test_markdown_with_only_code_has_no_prose(tmp_path, content):
    path = tmp_path / "snippet.md"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ExtractionError, match=r"no prose to summarize \(only code\)") as info:
        extract_text(path)
    assert str(info.value) == f"{path}: no prose to summarize (only code)"


def test_code_fences_in_plain_text_are_text(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("```\nkept\n```\n", encoding="utf-8")
    assert extract_text(path) == "``` kept ```"


def test_stdin_pdf_bytes_are_read_as_pdf(stdin_bytes):
    stdin_bytes(SAMPLE_PDF.read_bytes())
    assert extract_text("-").startswith("Target Tier Policy\n\nGeneral")


def test_pdftotext_style_form_feeds_are_page_breaks(tmp_path):
    bodies = ["Whales sing\nat dawn.", "Owls hunt\nat night.", "Bees dance\nat noon.", "Bats fly\nat dusk."]
    pages = [f"Chapter 1 — {n}\n{body}\n{n}\n" for n, body in enumerate(bodies, start=1)]
    path = tmp_path / "converted.txt"
    path.write_text("\f".join(pages), encoding="utf-8")
    expected = "\n\n".join(body.replace("\n", " ") for body in bodies)
    assert extract_text(path) == expected


def test_running_headers_that_change_by_section_are_found_by_their_page_number():
    sections = ["Linking", "Linking", "Example", "Example", "Reference", "Reference"]
    bodies = ["Whales sing.", "Owls hunt.", "Bees dance.", "Bats fly.", "Cats nap.", "Dogs dig."]
    pages = [
        f"Chapter {n // 2 + 1}: {section} {n + 5}\n{body}"  # printed page = index + 5
        for n, (section, body) in enumerate(zip(sections, bodies))
    ]
    assert clean_text("\f".join(pages)) == "\n\n".join(bodies)


def test_a_line_repeated_through_the_text_is_not_taken_for_a_header():
    line = "All requirements for tier 2 apply."
    pages = [f"{line}\nText {n} one.\n{line}\nText {n} two.\n{line}\nText {n} three." for n in range(4)]
    assert clean_text("\f".join(pages)).count(line) == 12


# --- encrypted PDFs ------------------------------------------------------------------------------


def test_encrypted_pdf_without_password_asks_for_one(encrypted_pdf):
    with pytest.raises(ExtractionError, match=r"encrypted; pass --password") as info:
        extract_text(encrypted_pdf)
    assert str(info.value).startswith(f"{encrypted_pdf}: ")


def test_encrypted_pdf_opens_with_the_right_password(encrypted_pdf, pdf_password):
    assert "fixed-size state" in extract_text(encrypted_pdf, password=pdf_password)


def test_encrypted_pdf_with_a_wrong_password(encrypted_pdf):
    with pytest.raises(ExtractionError, match="wrong password"):
        extract_text(encrypted_pdf, password="not-it")


def test_encrypted_pdf_with_an_empty_user_password_needs_none(tmp_path, pdf_factory):
    path = pdf_factory(tmp_path / "protected.pdf", ["Copying is restricted."], password="")
    assert extract_text(path) == "Copying is restricted."
    assert extract_text(path, password="ignored") == "Copying is restricted."


# --- bad inputs: one line, naming the input, never a traceback ------------------------------------


def _garbage(n: int = 4096) -> bytes:
    return bytes((i * 7919 + 13) % 256 for i in range(n))


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("image_only", r"has no text layer \(scanned\?\); OCR is not supported"),
        ("truncated", r"not a readable PDF"),
        ("empty_pdf", r"the file is empty"),
        ("empty_txt", r"the file is empty"),
        ("garbage_pdf", r"not a readable PDF"),
        ("garbage_txt", r"binary data"),
        ("garbage_unknown", r"binary data"),
        ("garbage_no_nul", r"binary data"),
        ("text_named_pdf", r"not a readable PDF"),
        ("blank_txt", r"no text found"),
        ("missing", r"no such file"),
        ("directory", r"is a directory"),
    ],
)
def test_bad_input_raises_one_line(case, message, tmp_path, image_only_pdf, truncated_pdf):
    paths = {
        "image_only": image_only_pdf,
        "truncated": truncated_pdf,
        "missing": tmp_path / "missing.pdf",
        "directory": tmp_path,
    }
    contents = {
        "empty_pdf": ("empty.pdf", b""),
        "empty_txt": ("empty.txt", b""),
        "garbage_pdf": ("garbage.pdf", _garbage()),
        "garbage_txt": ("garbage.txt", _garbage()),
        "garbage_unknown": ("garbage.bin", b"\x89PNG\r\n\x1a\n" + _garbage()),
        "garbage_no_nul": ("garbage.txt", bytes(range(1, 256)) * 16),
        "text_named_pdf": ("notes.pdf", b"just some text"),
        "blank_txt": ("blank.txt", " \n\t\n\u00a0\n\f\n".encode()),
    }
    if case in contents:
        name, data = contents[case]
        paths[case] = tmp_path / name
        paths[case].write_bytes(data)
    with pytest.raises(ExtractionError, match=message) as info:
        extract_text(paths[case])
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{paths[case]}: ")
    assert isinstance(info.value, SummarizeError)


@pytest.mark.parametrize(("data", "message"), [(b"", "empty"), (_garbage(), "binary data")])
def test_bad_stdin_raises_one_line(data, message, stdin_bytes):
    stdin_bytes(data)
    with pytest.raises(ExtractionError, match=f"<stdin>: .*{message}"):
        extract_text("-")


def test_iter_pdf_pages_wraps_errors_too(truncated_pdf):
    with pytest.raises(ExtractionError, match="not a readable PDF"):
        next(iter_pdf_pages(truncated_pdf))


def test_pypdf_logging_is_silent_unless_verbose(truncated_pdf, caplog):
    caplog.set_level(logging.WARNING)
    pypdf_logger = logging.getLogger("pypdf")
    level = pypdf_logger.level
    with pytest.raises(ExtractionError):
        extract_text(truncated_pdf)
    assert not [r for r in caplog.records if r.name.startswith("pypdf")]
    assert pypdf_logger.level == level  # restored afterwards
    with pytest.raises(ExtractionError):
        extract_text(truncated_pdf, verbose=True)
    assert [r for r in caplog.records if r.name.startswith("pypdf")]


# --- clean_text ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("exam-\nple", "example"),  # hyphenated at a line break: rejoined
        ("a well-known fact", "a well-known fact"),  # a real hyphen mid-line: kept
        ("it is well-\nknown, as well-known things are", "it is well-known, as well-known things are"),
        ("Jean-\nPaul and COVID-\n19", "Jean-Paul and COVID-19"),  # capital or digit: keep hyphen
        ("a dash -\nthen more", "a dash - then more"),
        ("the ﬁrst ﬂoor oﬃce", "the first floor office"),
        ("hy\u00adphen\u00ad\nation", "hyphenation"),  # soft hyphens
        ("zero\u200bwidth\u2060joiner", "zerowidthjoiner"),
        ("cafe\u0301", "café"),  # NFC
        ("  tabs\tand   runs  \n  trailing   \n\n\n\nnext  ", "tabs and runs trailing\n\nnext"),
        ("line\u2028break\u2029para", "line break\n\npara"),
        ("nul\x00 and bell\x07 gone", "nul and bell gone"),
        ("1 Intro . . . . . . 3", "1 Intro … 3"),  # dot leaders of a table of contents
    ],
)
def test_clean_text(raw, clean):
    assert clean_text(raw) == clean


SPECIAL = list(LIGATURES) + list("-.\n\n \t\f\r\u00ad\u200b\u2028\u2029\u0301#•") + ["e\u0301", "Page 3"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(SPECIAL), st.text(max_size=8)), max_size=40).map("".join))
def test_clean_text_is_idempotent_nfc_and_ligature_free(text):
    once = clean_text(text)
    assert clean_text(once) == once
    assert unicodedata.is_normalized("NFC", once)
    assert not set(LIGATURES) & set(once)
    assert once == once.strip() and "\n\n\n" not in once and "  " not in once

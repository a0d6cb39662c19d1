"""EPUB, Word (.docx) and HTML inputs: files made here with the standard library, read to clean
text with their sections as `#` headings, found in folders, summarized end to end."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from summarize.inputs import archive, html
from summarize.inputs.extract import ExtractionError, extract_document, extract_text

CHAPTERS = [
    ("The Hive", "Bees live in colonies of many thousands. A single queen lays every egg of the colony in spring."),
    ("The Flowers", "Worker bees visit flowers to gather nectar and pollen. They carry the nectar home in a honey stomach."),
    ("The Honey", "Nectar is dried by fanning wings until it turns into honey. Sealed cells keep the honey for years."),
]
BOILERPLATE = ["Accept all cookies", "Home | About us | Shop now", "Copyright 2024 Example Corp"]


# --- documents made with the standard library ---------------------------------------------------


def make_epub(path: Path, chapters=CHAPTERS, *, epub3: bool = True, headings: bool = False) -> Path:
    """An EPUB whose manifest and file names list the chapters in reverse, so that only the spine
    gives their order; titles only in the table of contents unless `headings`."""
    files = {f"OEBPS/text/ch{len(chapters) - i}.xhtml": chapter for i, chapter in enumerate(chapters)}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml", """<?xml version="1.0"?>
<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
  <rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles>
</container>""")
        items, refs, links, points = [], [], [], []
        for n, (name, (title, body)) in enumerate(files.items()):
            href = name.removeprefix("OEBPS/")
            head = f"<h1>{title}</h1>" if headings else ""
            z.writestr(name, f"""<?xml version="1.0" encoding="utf-8"?>
<html xmlns="http://www.w3.org/1999/xhtml"><head><title>{title}</title><style>p {{ margin: 0 }}</style></head>
<body>{head}<p>{body.replace('. ', '.</p><p>')}</p></body></html>""")
            items.append(f'<item id="c{n}" href="{href}" media-type="application/xhtml+xml"/>')
            refs.append(f'<itemref idref="c{n}"/>')
            links.append(f'<li><a href="{href.removeprefix("text/")}">{title}</a></li>')
            points.append(f'<navPoint id="p{n}"><navLabel><text>{title}</text></navLabel><content src="{href}"/></navPoint>')
        if epub3:
            items.append('<item id="nav" href="text/nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>')
            z.writestr("OEBPS/text/nav.xhtml", '<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops">'
                       f'<body><nav epub:type="toc"><ol>{"".join(links)}</ol></nav></body></html>')
        else:
            items.append('<item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>')
            z.writestr("OEBPS/toc.ncx", '<ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1">'
                       f'<navMap>{"".join(points)}</navMap></ncx>')
        z.writestr("OEBPS/content.opf", f"""<?xml version="1.0"?>
<package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Bees</dc:title></metadata>
  <manifest>{"".join(items[::-1])}</manifest>
  <spine{"" if epub3 else ' toc="ncx"'}>{"".join(refs)}</spine>
</package>""")
    return path


W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def make_docx(path: Path, *, styles: bool = True) -> Path:
    """A Word file: a title, two headings over paragraphs, and a table. With `styles`, the heading
    style ids are not Word's English ones: only styles.xml says they are headings."""
    heading = "Kop1" if styles else "Heading1"

    def para(text: str, style: str | None = None) -> str:
        props = f'<w:pPr><w:pStyle w:val="{style}"/></w:pPr>' if style else ""
        return f"<w:p>{props}<w:r><w:t xml:space=\"preserve\">{text}</w:t></w:r></w:p>"

    def row(*cells: str) -> str:
        return "<w:tr>" + "".join(f"<w:tc>{para(c)}</w:tc>" for c in cells) + "</w:tr>"

    body = "".join([
        para("Beekeeping for Beginners", "Title"),
        para(CHAPTERS[0][0], heading), para(CHAPTERS[0][1]),
        '<w:p><w:r><w:t>A deleted word </w:t></w:r><w:del><w:r><w:delText>NEVERSHOWN</w:delText></w:r></w:del>'
        '<w:r><w:t>is left out of the text of this paragraph entirely.</w:t></w:r></w:p>',
        para(CHAPTERS[1][0], heading), para(CHAPTERS[1][1]),
        "<w:tbl>" + row("Month", "Yield") + row("May", "4 kg") + "</w:tbl>",
    ])
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("[Content_Types].xml", '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/'
                   'content-types"><Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-'
                   'officedocument.wordprocessingml.document.main+xml"/></Types>')
        z.writestr("word/document.xml", f'<?xml version="1.0"?><w:document xmlns:w="{W_NS}"><w:body>{body}</w:body></w:document>')
        if styles:
            z.writestr("word/styles.xml", f'<?xml version="1.0"?><w:styles xmlns:w="{W_NS}">'
                       '<w:style w:type="paragraph" w:styleId="Title"><w:name w:val="Title"/></w:style>'
                       f'<w:style w:type="paragraph" w:styleId="{heading}"><w:name w:val="Kop 1"/>'
                       '<w:pPr><w:outlineLvl w:val="0"/></w:pPr></w:style></w:styles>')
    return path


def page_html(body_paragraphs: list[str] | None = None) -> str:
    """A web page: navigation, a cookie banner and a footer around an article."""
    paragraphs = body_paragraphs or [text for _, text in CHAPTERS]
    article = "".join(f"<h2>{title}</h2><p>{text} {text}</p>" for (title, _), text in zip(CHAPTERS, paragraphs))
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>Bees</title>
<script>var tracking = "TRACKER";</script></head><body>
<nav><ul><li><a href="/">Home</a></li><li><a href="/about">About us</a></li><li><a href="/shop">Shop now</a></li></ul></nav>
<div id="cookie-banner" class="cookie-consent">We use cookies to improve your experience. Accept all cookies.</div>
<main><article><h1>How bees make honey</h1>{article}
<table><tr><th>Month</th><th>Yield</th></tr><tr><td>May</td><td>4 kg</td></tr></table></article></main>
<footer><p>Copyright 2024 Example Corp. All rights reserved.</p><p>Privacy policy</p></footer>
</body></html>"""


# --- extraction ---------------------------------------------------------------------------------


@pytest.mark.parametrize("epub3", [True, False], ids=["nav", "ncx"])
def test_epub_chapters_in_spine_order_under_their_titles(tmp_path: Path, epub3: bool):
    text = extract_text(make_epub(tmp_path / "bees.epub", epub3=epub3))
    paragraphs = text.split("\n\n")
    headings = [p for p in paragraphs if p.startswith("# ")]
    assert headings == [f"# {title}" for title, _ in CHAPTERS]
    assert "Bees live in colonies" in paragraphs[1] and "p { margin" not in text
    assert text.index("The Hive") < text.index("The Flowers") < text.index("The Honey")


def test_epub_chapter_headings_are_not_doubled(tmp_path: Path):
    text = extract_text(make_epub(tmp_path / "bees.epub", headings=True))
    assert text.count("The Hive") == 1 and text.startswith("# The Hive\n\n")


def test_docx_paragraphs_headings_and_tables(tmp_path: Path):
    for styles in (True, False):
        text = extract_text(make_docx(tmp_path / f"memo{styles}.docx", styles=styles))
        paragraphs = text.split("\n\n")
        assert paragraphs[:3] == ["# Beekeeping for Beginners", "# The Hive", CHAPTERS[0][1]]
        assert "# The Flowers" in paragraphs
        assert paragraphs[-2:] == ["Month | Yield", "May | 4 kg"]
        assert "NEVERSHOWN" not in text and "A deleted word is left out" in text


def test_html_keeps_the_article_and_drops_the_boilerplate(tmp_path: Path):
    path = tmp_path / "page.html"
    path.write_text(page_html(), encoding="utf-8")
    text = extract_text(path)
    assert "## The Hive" in text.split("\n\n") and "Worker bees visit flowers" in text
    assert "May | 4 kg" in text.split("\n\n")
    for junk in [*BOILERPLATE, "TRACKER", "Privacy policy"]:
        assert junk not in text


def test_html_without_the_extra_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import sys

    monkeypatch.setitem(sys.modules, "trafilatura", None)  # import fails as if not installed
    path = tmp_path / "page.htm"
    path.write_text(page_html(), encoding="utf-8")
    with pytest.raises(ExtractionError, match=r"page.htm: .*'html' extra: pip install 'summarize\[html\]'"):
        extract_text(path)


def test_a_page_of_too_many_blocks_is_read_whole_without_trafilatura(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import trafilatura

    calls = []
    real = trafilatura.extract
    monkeypatch.setattr(trafilatura, "extract", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    monkeypatch.setattr(html, "MAX_BLOCKS", 60)  # a page of a few KB stands for one of megabytes
    notes: list[str] = []
    blocks = sum(page_html().count(tag) for tag in ("<p>", "<li>", "<div "))
    paragraphs = [f"Comment {n} says the bees were busy." for n in range(html.MAX_BLOCKS - blocks)]
    for name, extra in [("small.html", []), ("huge.html", ["One more makes too many."])]:
        path = tmp_path / name
        path.write_text(page_html() + "".join(f"<li>{text}</li>" for text in paragraphs + extra), encoding="utf-8")
        calls.clear()
        text = extract_document(path, notify=notes.append).text
        assert "Worker bees visit flowers" in text
        if name == "small.html":  # at the bound: trafilatura picks the main text
            assert calls and not notes and "Accept all cookies" not in text
    # over it: the plain markup reader, every block kept, and a note that says so
    assert not calls and f"Comment {len(paragraphs) - 1} says" in text and "One more makes too many." in text
    (note,) = notes
    assert note.startswith(f"{tmp_path / 'huge.html'}: more than {html.MAX_BLOCKS:,} blocks")


@pytest.mark.parametrize(("name", "content", "message"), [
    ("book.epub", b"just some text, not a book at all", "not a ZIP archive"),
    ("memo.docx", b"PK\x03\x04" + bytes(60), "a damaged or truncated ZIP archive"),
    ("notes.txt", None, "a ZIP archive, not an EPUB or a Word"),
])
def test_broken_documents_say_what_they_are(tmp_path: Path, name: str, content: bytes | None, message: str):
    path = tmp_path / name
    if content is None:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("data.bin", bytes(100))
    else:
        path.write_bytes(content)
    with pytest.raises(ExtractionError, match=f"{name}: {message}"):
        extract_text(path)


def test_a_zip_bomb_is_refused_by_what_it_unpacks_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(archive, "MAX_UNPACKED", 1 << 20)
    path = tmp_path / "bomb.docx"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("word/document.xml", b" " * (2 << 20))
    assert path.stat().st_size < 1 << 16
    with pytest.raises(ExtractionError, match="bomb.docx: unpacks to more than 1M"):
        extract_text(path)


# --- through the CLI ----------------------------------------------------------------------------


def test_each_format_summarized_end_to_end(tmp_path: Path, run_cli):
    make_epub(tmp_path / "book.epub")
    make_docx(tmp_path / "memo.docx")
    (tmp_path / "page.html").write_text(page_html(), encoding="utf-8")
    for name in ("book.epub", "memo.docx", "page.html"):
        result = run_cli(str(tmp_path / name), "--extractive", "-n", "40", "--json")
        assert result.exit_code == 0, result.output
        record = json.loads(result.stdout)
        assert record["input"] == str(tmp_path / name)
        assert any(word in record["summary"] for word in ("bees", "Bees", "nectar", "honey"))
        assert "#" not in record["summary"] and "Accept all cookies" not in record["summary"]


def test_folders_pick_the_new_suffixes_up(tmp_path: Path, run_cli):
    docs, out = tmp_path / "docs", tmp_path / "out"
    docs.mkdir()
    make_epub(docs / "book.epub")
    make_docx(docs / "memo.docx")
    (docs / "page.htm").write_text(page_html(), encoding="utf-8")
    (docs / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    result = run_cli(str(docs), "-o", str(out), "--extractive", "-n", "30")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["book.summary.md", "memo.summary.md", "page.summary.md"]

"""The text of an EPUB book (2 or 3): its chapters in spine order, each under its title as a
Markdown `#` heading. An EPUB is a ZIP archive: META-INF/container.xml names the package (OPF)
file, whose manifest lists the files and whose spine orders the chapters; the table of contents
(EPUB 3 nav document, or EPUB 2 NCX) gives the chapters' titles.
"""

from __future__ import annotations

from xml.etree import ElementTree

from summarize.inputs.archive import Archive, member_path
from summarize.inputs.markup import markup_text
from summarize.inputs.places import heading_title
from summarize.inputs.read_bytes import ExtractionError

CONTAINER = "META-INF/container.xml"
CHAPTER_TYPES = ("application/xhtml+xml", "text/html")
NCX_TYPE = "application/x-dtbncx+xml"


def is_epub(archive: Archive) -> bool:
    return CONTAINER in archive.names


def epub_chapters(archive: Archive) -> list[tuple[str | None, str]]:
    """The chapters that hold text, in reading order: (title, text). A chapter that does not open
    with a heading gets its title from the table of contents, as a `#` line; a title is that
    heading, None where there is none."""
    rootfile = archive.xml(CONTAINER).find(".//{*}rootfile")
    if rootfile is None or not rootfile.get("full-path"):
        raise ExtractionError(f"{archive.label}: {CONTAINER} names no package file")
    opf_path = rootfile.get("full-path", "")
    opf = archive.xml(opf_path)
    manifest = {item.get("id"): item for item in opf.iterfind(".//{*}manifest/{*}item")}
    spine = opf.find(".//{*}spine")
    if spine is None:
        raise ExtractionError(f"{archive.label}: the book has no spine (no reading order)")
    titles = _toc_titles(archive, opf_path, manifest.values(), spine.get("toc"))
    chapters = []
    for itemref in spine.iterfind("{*}itemref"):
        item = manifest.get(itemref.get("idref"))
        if item is None or item.get("media-type") not in CHAPTER_TYPES or itemref.get("linear") == "no":
            continue
        path = member_path(opf_path, item.get("href", ""))
        text = _with_title(markup_text(archive.read(path).decode("utf-8", errors="replace")), titles.get(path))
        if text:
            chapters.append((_title(text), text))
    return chapters


def _title(chapter: str) -> str | None:
    first = chapter.split("\n", 1)[0]
    return (heading_title(first.lstrip("#")) or None) if first.startswith("#") else None


def _with_title(text: str, title: str | None) -> str:
    if not title or text.startswith("#"):
        return text
    first, _, rest = text.partition("\n\n")
    if " ".join(first.split()).casefold() == title.casefold():  # the title printed as a plain paragraph
        text = rest
    return f"# {title}\n\n{text}"


def _toc_titles(archive: Archive, opf_path: str, items, ncx_id: str | None) -> dict[str, str]:
    """Archive path of each chapter → its title in the table of contents (the first entry that
    points into it)."""
    titles: dict[str, str] = {}
    for item in items:
        href = member_path(opf_path, item.get("href", ""))
        if "nav" in (item.get("properties") or "").split():  # EPUB 3
            for link in _nav_links(archive.read(href).decode("utf-8", errors="replace")):
                titles.setdefault(member_path(href, link[0]), link[1])
        elif item.get("id") == ncx_id or item.get("media-type") == NCX_TYPE:  # EPUB 2
            for point in archive.xml(href).iterfind(".//{*}navPoint"):
                label, content = point.find("{*}navLabel/{*}text"), point.find("{*}content")
                if label is not None and label.text and content is not None:
                    titles.setdefault(member_path(href, content.get("src", "")), " ".join(label.text.split()))
    return titles


def _nav_links(markup: str) -> list[tuple[str, str]]:
    """(href, text) of each link of a nav document; none when it is not well-formed XML (the
    chapters' own headings then stand alone)."""
    try:
        root = ElementTree.fromstring(markup)
    except ElementTree.ParseError:  # an entity such as &nbsp; that XML does not know
        return []
    return [(a.get("href", ""), " ".join("".join(a.itertext()).split())) for a in root.iterfind(".//{*}a") if a.get("href")]

"""The members of a ZIP-based document (EPUB, Word .docx), read within a bound on what they unpack
to: a file of a few MB may otherwise unpack to gigabytes.
"""

from __future__ import annotations

import io
import posixpath
import zipfile
import zlib
from urllib.parse import unquote
from xml.etree import ElementTree

from summarize.errors import first_line
from summarize.inputs.read_bytes import ExtractionError
from summarize.settings import format_size

MAX_UNPACKED = 512 << 20  # bytes all members read from one document may unpack to


class Archive:
    """A ZIP archive held in memory; every failure is an ExtractionError naming the input."""

    def __init__(self, data: bytes, label: str) -> None:
        self.label = label
        self._budget = MAX_UNPACKED
        try:
            self._zip = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise ExtractionError(f"{label}: a damaged or truncated ZIP archive ({first_line(exc)[:160]})") from exc
        self.names = set(self._zip.namelist())

    def read(self, name: str) -> bytes:
        try:
            info = self._zip.getinfo(name)
        except KeyError:
            raise ExtractionError(f"{self.label}: {name} is missing from the archive") from None
        if info.file_size > self._budget:
            raise ExtractionError(f"{self.label}: unpacks to more than {format_size(MAX_UNPACKED)}")
        self._budget -= info.file_size  # the declared size bounds what zipfile reads
        try:
            return self._zip.read(info)
        except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, OSError, EOFError) as exc:
            # RuntimeError: an encrypted member; NotImplementedError: a compression zipfile lacks
            raise ExtractionError(f"{self.label}: cannot unpack {name} ({first_line(exc)[:160]})") from exc

    def xml(self, name: str) -> ElementTree.Element:
        """A member parsed as XML (expat refuses entity expansion bombs)."""
        try:
            return ElementTree.fromstring(self.read(name))
        except ElementTree.ParseError as exc:
            raise ExtractionError(f"{self.label}: {name} is not well-formed XML ({exc})") from exc


def member_path(base: str, href: str) -> str:
    """The archive path of `href` (URL-encoded, relative to the member `base`, maybe with #fragment)."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(base), unquote(href.split("#", 1)[0])))

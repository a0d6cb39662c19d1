"""An input's bytes, read within a size limit: a regular file, a pipe or FIFO read as a stream
(`<(cmd)`, `/dev/stdin`), or stdin; what cannot hold a document (a socket, a terminal, a device)
is said for what it is. Binary data is refused from its first KiB, before the rest is read.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO

from summarize.errors import SummarizeError
from summarize.settings import DEFAULT_MAX_INPUT_SIZE, STDIN, STDIN_LABEL, format_size

READ_BLOCK = 1 << 20  # bytes read at a time from a stream
SNIFF_BYTES = 1024  # what is binary is decided from this much
PDF_MAGIC = b"%PDF-"
ZIP_MAGIC = b"PK\x03\x04"  # EPUB and Word (.docx) files are ZIP archives
PDF_MAGIC_WINDOW = 1024  # the PDF spec lets the header start anywhere in the first 1 KiB
# UTF-16 without a BOM: in its ASCII text every other byte is NUL, on one side only
UTF16_NUL_SHARE = 0.4
_BOM_STARTS = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")
_KINDS = {stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device (a terminal or a device such as /dev/zero)",
          stat.S_IFBLK: "a block device"}


class ExtractionError(SummarizeError):
    """An input could not be turned into text; the message is one line naming the input."""


def read_local_input(source: str | Path, *, max_bytes: int = DEFAULT_MAX_INPUT_SIZE) -> bytes:
    """The bytes of a file, or of stdin when `source` is "-"; ExtractionError (one line naming the
    input) for a missing, empty, unreadable, binary or too large one."""
    if str(source) == STDIN:
        return _read_stdin(max_bytes)
    return read_file(Path(source), str(source), max_bytes)


def looks_like_pdf(data: bytes) -> bool:
    return PDF_MAGIC in data[:PDF_MAGIC_WINDOW]


def looks_like_zip(data: bytes) -> bool:
    return data.startswith(ZIP_MAGIC)


# what a file named .pdf turns out to be, by its first bytes
_MAGIC = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
          (b"PK\x03\x04", "a ZIP archive (or a Word, Excel or EPUB file)"), (b"\x1f\x8b", "a gzip archive"),
          (b"\x7fELF", "a program (ELF)"), (b"<!DOCTYPE html", "an HTML page"), (b"<html", "an HTML page"),
          (b"II*\x00", "a TIFF image"), (b"MM\x00*", "a TIFF image"), (b"\xd0\xcf\x11\xe0", "an old Office file"))


def known_kind(data: bytes) -> str | None:
    """What `data` is by its magic bytes ("a PNG image"), when it is a common format."""
    head = data[:16].lstrip()
    return next((kind for magic, kind in _MAGIC if head[: len(magic)].lower() == magic.lower()), None)


def utf16_without_bom(data: bytes) -> str | None:
    """"utf-16-le" or "utf-16-be" when `data` looks like UTF-16 text without a BOM, else None."""
    sample = data[: SNIFF_BYTES * 4]
    pairs = len(sample) // 2
    if pairs < 4:
        return None
    even, odd = sample[0 : 2 * pairs : 2].count(0), sample[1 : 2 * pairs : 2].count(0)
    if odd >= UTF16_NUL_SHARE * pairs and even <= 0.02 * pairs:
        return "utf-16-le"
    if even >= UTF16_NUL_SHARE * pairs and odd <= 0.02 * pairs:
        return "utf-16-be"
    return None


def read_file(path: Path, label: str, max_bytes: int = DEFAULT_MAX_INPUT_SIZE) -> bytes:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ExtractionError(f"{label}: {_why_missing(path)}") from None
    except OSError as exc:
        raise ExtractionError(f"{label}: {_why_unreadable(path, exc)}") from exc
    if stat.S_ISDIR(st.st_mode):
        raise ExtractionError(f"{label}: is a directory, not a file")
    kind = _KINDS.get(stat.S_IFMT(st.st_mode))
    if kind is not None:
        raise ExtractionError(f"{label}: is {kind}, not a file")
    if stat.S_ISREG(st.st_mode):
        if st.st_size == 0:
            raise ExtractionError(f"{label}: the file is empty")
        check_size(st.st_size, label, max_bytes)
    try:
        with open(path, "rb") as f:  # a FIFO or pipe (`<(cmd)`) is read as a stream
            # a .pdf is read as one whatever it holds: pypdf's reading says what is wrong with it
            data = read_limited(f, label, max_bytes, sniff=path.suffix.lower() != ".pdf")
    except OSError as exc:
        raise ExtractionError(f"{label}: cannot read the file ({exc.strerror or exc})") from exc
    if not data:
        raise ExtractionError(f"{label}: the file is empty" if stat.S_ISREG(st.st_mode) else f"{label}: the input is empty")
    return data


def _read_stdin(max_bytes: int) -> bytes:
    if sys.stdin is None:
        raise ExtractionError(f"{STDIN_LABEL}: no standard input to read")
    buffer = getattr(sys.stdin, "buffer", None)  # a test harness may install a text-only stdin
    if buffer is None:
        data = sys.stdin.read(max_bytes + 1).encode("utf-8")
        check_size(len(data), STDIN_LABEL, max_bytes)
    else:
        data = read_limited(buffer, STDIN_LABEL, max_bytes)
    if not data:
        raise ExtractionError(f"{STDIN_LABEL}: the input is empty")
    return data


def read_limited(f: BinaryIO, label: str, max_bytes: int, *, sniff: bool = True) -> bytes:
    """All of `f` in blocks, refused once past `max_bytes` or (`sniff`) when its first KiB is binary."""
    blocks: list[bytes] = []
    total = 0
    while True:
        block = f.read(READ_BLOCK)
        if not block:
            break
        if not blocks and sniff:
            _refuse_binary_head(block, label)
        blocks.append(block)
        total += len(block)
        check_size(total, label, max_bytes)
    return b"".join(blocks)


def _refuse_binary_head(head: bytes, label: str) -> None:
    """NUL bytes in the first KiB of what is no PDF, no UTF-16/32 text: binary, said before the
    rest is read (the whole text is checked again when it is decoded)."""
    sniff = head[:SNIFF_BYTES]
    if b"\x00" not in sniff or looks_like_pdf(sniff) or looks_like_zip(sniff) or sniff.startswith(_BOM_STARTS):
        return
    if utf16_without_bom(head) is None:
        raise ExtractionError(f"{label}: binary data, not a PDF or a text file")


def check_size(size: int, label: str, max_bytes: int) -> None:
    if size > max_bytes:
        raise ExtractionError(f"{label}: larger than {format_size(max_bytes)}, the input size limit "
                              "(--max-input-size raises it)")


def _why_missing(path: Path) -> str:
    """"no such file", or what is wrong with the symbolic link in its place."""
    if not path.is_symlink():
        return "no such file"
    try:
        path.resolve(strict=True)
    except FileNotFoundError:
        return f"a symbolic link to {os.readlink(path)}, which does not exist"
    except (OSError, RuntimeError):  # RuntimeError: pathlib's "Symlink loop" before Python 3.13
        return "a symbolic link loop"
    return "no such file"


def _why_unreadable(path: Path, exc: OSError) -> str:
    if exc.errno == 40:  # ELOOP
        return "a symbolic link loop"
    return f"cannot read the file ({exc.strerror or exc})"

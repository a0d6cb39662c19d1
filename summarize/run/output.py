"""Where summaries land: stdout (one alone, several under `==> name <==` headers like `tail`, or one
JSON line per input, failed and skipped ones included), or files written atomically.

A Markdown output's first line is an HTML comment (Markdown does not show it) holding the fingerprint
of the settings the run asked for, then the method that wrote the summary: `<!-- summarize
3f2a9c1b7d4e extractive -->`. An output is up to date, and skipped, when it is newer than its input
and its fingerprint is this run's, whichever method wrote it: an extractive fallback is not redone
on every re-run (`--force` redoes it). Headers from before the method was recorded (`<!-- summarize
3f2a9c1b7d4e -->`) held the fingerprint of the settings of the method that wrote them, which is the
asked-for one unless the model fell back; they are read by the same rule.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import TextIO

from summarize.errors import SummarizeError
from summarize.files import write_atomic
from summarize.records import Job, Result, Summary
from summarize.settings import Settings
from summarize.ui.escape import printable

HEADER = "<!-- summarize {fingerprint} {method} -->"
_HEADER_LINE = re.compile(r"<!-- summarize (?P<fingerprint>[0-9a-f]+)(?: (?P<method>\S+))? -->")
UP_TO_DATE = "up to date"  # a skipped input's JSON record says why with this
_HEADER_READ = 256  # bytes: the header line is shorter; a longer first line is no header of ours

# json.dumps(ensure_ascii=False) escapes C0 controls only; DEL and C1 controls would reach a
# terminal raw, and a lone surrogate (an undecodable file name) could not be encoded at all.
_RAW_IN_JSON = re.compile("[\x7f-\x9f\ud800-\udfff]")


# --- stdout --------------------------------------------------------------------------------


def print_summary(out: TextIO, job: Job, result: Result, *, header: bool, first: bool) -> None:
    """`result`'s summary text on `out`, under a `==> name <==` header when `header`."""
    summary = result.summary
    assert summary is not None
    head = (("" if first else "\n") + f"==> {printable(job.label)} <==\n") if header else ""
    write_all(out, head + summary.text.rstrip("\n") + "\n")


def print_record(out: TextIO, job: Job, result: Result) -> None:
    """`result` as one JSON line on `out`, whatever became of the input."""
    line = json.dumps(_record(job, result), ensure_ascii=False)
    write_all(out, _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", line) + "\n")


def write_all(out: TextIO, text: str) -> None:
    """Write all of `text` to `out`, or raise OSError. An unbuffered text stream (PYTHONUNBUFFERED)
    drops what a short write left over, so a stream with a file descriptor gets the encoded bytes
    through os.write until every byte is taken; another stream is written until it has taken
    every character."""
    try:
        fd = out.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation: no descriptor behind it
        fd = None
    if fd is None:
        rest = text
        while rest:
            taken = out.write(rest)
            if taken is None or taken >= len(rest):
                break
            if taken <= 0:
                raise OSError(errno.EIO, "a write took nothing")
            rest = rest[taken:]
        out.flush()
        return
    out.flush()  # what the stream holds goes first
    data = memoryview(text.encode(out.encoding or "utf-8", out.errors or "strict"))
    while data:
        taken = os.write(fd, data)
        if taken <= 0:
            raise OSError(errno.EIO, "a write took nothing")
        data = data[taken:]


def _record(job: Job, result: Result) -> dict:
    """Every record has `input` and `ok`; then `summary`, `words`, `method`, `seconds`, the
    method's extras, `output` and `sources` (where each sentence comes from) for a summary;
    `skipped` and `output` for an up-to-date output; `error` for a failure."""
    record: dict = {"input": job.input}
    if result.status == "failed":
        return record | {"error": result.reason, "ok": False}
    if result.status == "skipped":
        return record | {"skipped": UP_TO_DATE, "output": str(result.output), "ok": True}
    summary = result.summary
    assert summary is not None
    record |= {
        "summary": summary.text,
        "words": summary.words,
        "method": summary.method,
        "seconds": round(result.seconds or 0.0, 3),
    }
    if job.output is not None:
        record["output"] = str(job.output)
    for key, value in summary.extra.items():
        record.setdefault(key, value)
    record["sources"] = [source.record(index) for index, source in enumerate(summary.sources)]
    record.setdefault("ok", True)
    return record


# --- output files --------------------------------------------------------------------------


def write_summary(output: Path, summary: Summary, settings: Settings, *, force: bool = False) -> None:
    """Write `summary` to `output` atomically, under its fingerprint header where it has one.
    Raises SummarizeError when `output` holds something summarize did not write (see
    `check_replaceable`)."""
    check_replaceable(output, force=force)
    write_atomic(output, _file_text(summary, settings, output))


def _file_text(summary: Summary, settings: Settings, output: Path) -> str:
    body = summary.text.rstrip("\n") + "\n"
    if not _carries_header(output):
        return body
    # The asked-for settings' fingerprint, so that a re-run finds a fallback up to date too; the
    # method beside it tells a reader which kind of summary this is.
    return HEADER.format(fingerprint=settings.fingerprint(), method=summary.method) + "\n" + body


def _carries_header(output: Path) -> bool:
    """Only Markdown hides the fingerprint comment; a `.txt` output stays the bare summary."""
    return output.suffix.lower() in (".md", ".markdown")


def check_replaceable(output: Path, *, force: bool) -> None:
    """Raise SummarizeError when `output` exists and summarize may not replace it: only a file
    that it wrote (its header says so) or an empty one is replaced, anything else with --force."""
    if force:
        return
    try:
        st = output.stat()
    except FileNotFoundError:
        if output.is_symlink():  # a dangling link: replacing it would lose where it pointed
            raise SummarizeError(f"{output} is a symbolic link summarize did not make; "
                                 "--force replaces it") from None
        return
    except OSError:  # a loop or a locked folder: the write says what is wrong
        return
    if stat.S_ISDIR(st.st_mode):
        raise SummarizeError(f"{output} is a folder")
    if stat.S_ISREG(st.st_mode) and (st.st_size == 0 or written_by_summarize(output)):
        return
    kind = "a file" if stat.S_ISREG(st.st_mode) else "something other than a regular file"
    raise SummarizeError(f"{output} is {kind} that summarize did not write; --force replaces it")


def written_by_summarize(path: Path) -> bool:
    """Whether `path` is a file whose first line is summarize's header."""
    return _header(path) is not None


def _header(path: Path) -> re.Match[str] | None:
    """The header on `path`'s first line, if it is a regular file with one: opened without
    blocking, so a FIFO in its place is not waited on."""
    if not _carries_header(path):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        first = os.read(fd, _HEADER_READ).split(b"\n", 1)[0].decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    return _HEADER_LINE.fullmatch(first.rstrip("\r"))


def is_up_to_date(job: Job, fingerprint: str) -> bool:
    """Whether `job.output` is newer than its input and was written for settings with `fingerprint`
    (by whichever method)."""
    if job.is_stdin or job.output is None or not _carries_header(job.output):
        return False
    try:
        if job.output.stat().st_mtime_ns < Path(job.input).stat().st_mtime_ns:
            return False
    except OSError:
        return False
    header = _header(job.output)
    return header is not None and header["fingerprint"] == fingerprint









"""Where summaries land: stdout (one alone, several under `==> name <==` headers like `tail`, or JSON
lines), or files written atomically, skipped when up to date: newer than their input and fingerprinted
on the first line (an HTML comment, which Markdown does not show) with the settings of this run.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TextIO

from summarize.types import Job, Result, Settings, Summary

HEADER = "<!-- summarize {fingerprint} -->"


# --- stdout --------------------------------------------------------------------------------


def print_summary(out: TextIO, job: Job, result: Result, *, json_lines: bool, header: bool, first: bool) -> None:
    """`result`'s summary on `out`: a JSON line, or the text (under a `==> name <==` header)."""
    summary = result.summary
    assert summary is not None
    if json_lines:
        out.write(json.dumps(_record(job, result, summary), ensure_ascii=False) + "\n")
    else:
        if header:
            out.write(("" if first else "\n") + f"==> {job.label} <==\n")
        out.write(summary.text.rstrip("\n") + "\n")
    out.flush()


def _record(job: Job, result: Result, summary: Summary) -> dict:
    record = {
        "input": job.input,
        "summary": summary.text,
        "words": summary.words,
        "method": summary.method,
        "seconds": round(result.seconds or 0.0, 3),
    }
    if job.output is not None:
        record["output"] = str(job.output)
    for key, value in summary.extra.items():
        record.setdefault(key, value)
    return record


# --- output files --------------------------------------------------------------------------


def write_summary(output: Path, summary: Summary, settings: Settings) -> None:
    """Write `summary` to `output` atomically, under its fingerprint header where it has one."""
    write_atomic(output, _file_text(summary, settings, output))


def _file_text(summary: Summary, settings: Settings, output: Path) -> str:
    body = summary.text.rstrip("\n") + "\n"
    if not _carries_header(output):
        return body
    # The fingerprint of what was actually made: an extractive fallback for a model run does
    # not count as up to date, so the model summary replaces it once a model is available.
    return HEADER.format(fingerprint=settings.fingerprint(summary.method)) + "\n" + body


def _carries_header(output: Path) -> bool:
    """Only Markdown hides the fingerprint comment; a `.txt` output stays the bare summary."""
    return output.suffix.lower() in (".md", ".markdown")


def is_up_to_date(job: Job, fingerprint: str) -> bool:
    """Whether `job.output` is newer than its input and was written with `fingerprint`."""
    if job.is_stdin or job.output is None or not _carries_header(job.output):
        return False
    try:
        if job.output.stat().st_mtime_ns < Path(job.input).stat().st_mtime_ns:
            return False
        with job.output.open(encoding="utf-8", errors="replace") as f:
            first_line = f.readline().rstrip("\n")
    except OSError:
        return False
    return first_line == HEADER.format(fingerprint=fingerprint)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one, nothing
    else; the temporary file is removed on any exception, KeyboardInterrupt included."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _file_mode(path: Path) -> int:
    """The mode a plain `open(path, "w")` would give (mkstemp's files are private, 0600)."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask

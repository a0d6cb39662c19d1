"""Plan a run: find the input files (folders scanned), decide where each summary goes (stdout, or
files under `-o`), and find what is wrong before anything is read.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from summarize.errors import SummarizeError
from summarize.inputs.extract import SUPPORTED_SUFFIXES
from summarize.inputs.url import is_url, url_file_name
from summarize.records import Job
from summarize.settings import STDIN

OUTPUT_SUFFIX = ".summary.md"


@dataclass(frozen=True)
class Plan:
    jobs: list[Job]
    headers: bool  # print `==> path <==` before each summary on stdout
    clashes: tuple[str, ...] = ()  # inputs whose summaries would land on one output: a usage error


class _Found(NamedTuple):
    input: str  # as the job will name it
    rel: Path  # its path relative to the folder it was found in (its name, for a file argument)
    problem: str  # known now: the job fails with this reason


def plan_jobs(inputs: Sequence[str], output: str | Path | None = None, *,
         diagnostics_file: str | Path | None = None) -> Plan:
    """Expand folders and map every input to its output.

    `output` is a file for one file input, else a folder (created when missing); a trailing
    slash, or an existing folder, makes it a folder for one input too.

    Raises SummarizeError for a command line that cannot work as a whole (the CLI's usage
    error), before anything is read or written: among them an output, or the `diagnostics_file`,
    that is one of the inputs however it is spelled. A problem with one input (it does not
    exist, a folder cannot be read) fails only that input, later.
    """
    if not inputs:
        raise SummarizeError("no input given")
    if sum(1 for i in inputs if i == STDIN) > 1:
        raise SummarizeError("'-' (stdin) can be read only once")
    several = len(inputs) > 1 or any(i != STDIN and not is_url(i) and Path(i).is_dir() for i in inputs)
    found = _expand(inputs)
    placed = _place(found, output, several)
    read = _FileSet(Path(f.input) for f in found if f.input != STDIN and not is_url(f.input))
    for job in placed.jobs:
        if job.output is not None and job.output in read:
            raise SummarizeError(
                f"-o {output}: the summary of {job.input} would overwrite the input {job.output}")
    written = [job.output for job in placed.jobs if job.output is not None]
    for folder in dict.fromkeys(path.parent for path in written):
        _check_writable_folder(folder, f"-o {output}")
    if diagnostics_file is not None:
        _check_diagnostics_file(Path(diagnostics_file), read, _FileSet(written))
    return placed


def _expand(inputs: Sequence[str]) -> list[_Found]:
    """Every input, folders expanded, in command-line order; a file or URL named twice is read once.
    A URL is kept as written (a path would lose its "//") and named for `-o` by `url_file_name`."""
    found: list[_Found] = []
    seen: set[Path] = set()
    urls: set[str] = set()
    for arg in inputs:
        if arg == STDIN:
            found.append(_Found(STDIN, Path("stdin"), ""))
            continue
        if is_url(arg):
            if arg not in urls:
                urls.add(arg)
                found.append(_Found(arg, url_file_name(arg), ""))
            continue
        path = Path(arg)
        if not path.is_dir():
            if _first_time(path, seen):
                found.append(_Found(str(path), Path(path.name), ""))
            continue
        files, unreadable = _scan(path)
        if not files and not unreadable:
            suffixes = ", ".join(SUPPORTED_SUFFIXES)
            found.append(_Found(str(path), Path(path.name), f"no {suffixes} files in this folder"))
        entries = [(rel, "") for rel in files] + [(rel, f"cannot read this folder ({why})") for rel, why in unreadable]
        for rel, problem in sorted(entries):
            if problem or _first_time(path / rel, seen):
                found.append(_Found(str(path / rel), rel, problem))
    return found


def _place(found: list[_Found], output: str | Path | None, several: bool) -> Plan:
    """The jobs for `found`, each with where its summary goes."""
    if output is None:
        return Plan([Job(f.input, problem=f.problem) for f in found], headers=several)
    wants_folder = str(output).endswith(("/", os.sep))
    output = Path(output)
    if not several and not wants_folder and not output.is_dir():
        (f,) = found
        return Plan([Job(f.input, output=output, problem=f.problem)], headers=False)
    if output.exists() and not output.is_dir():
        raise SummarizeError(f"-o {output}: is a file; several inputs or a folder need a folder")
    outputs = iter(_output_paths([f.rel for f in found if not f.problem], output))
    jobs: list[Job] = []
    owner: dict[Path, str] = {}
    clashes: list[str] = []
    for f in found:
        if f.problem:
            jobs.append(Job(f.input, problem=f.problem))
            continue
        out = next(outputs)
        if out in owner:
            jobs.append(Job(f.input, problem=f"its output {out} is already written for {owner[out]}"))
            clashes.append(f"-o {output}: the summaries of {owner[out]} and {f.input} would both be {out}")
        else:
            owner[out] = f.input
            jobs.append(Job(f.input, output=out))
    return Plan(jobs, headers=False, clashes=tuple(clashes))


class _FileSet:
    """Paths compared as the filesystem sees them: by (device, inode) where the path exists, so
    that a symlink, a hard link or another spelling of a file is that file; by resolved path where
    it does not exist (yet)."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self._ids: set[tuple[int, int]] = set()
        self._resolved: set[Path] = set()
        for path in paths:
            identity = _identity(path)
            if identity is not None:
                self._ids.add(identity)
            self._resolved.add(_resolved(path))

    def __contains__(self, path: Path) -> bool:
        identity = _identity(path)
        if identity is not None:
            return identity in self._ids
        return _resolved(path) in self._resolved


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()  # through symlinks: a link to an input is that input
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _resolved(path: Path) -> Path:
    """`path` with symlinks resolved, or only made absolute where that fails: a symlink loop then
    fails as an input when it is read, and the rest of the run goes on."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: pathlib's "Symlink loop" before Python 3.13
        return Path(os.path.abspath(path))


def _check_writable_folder(folder: Path, where: str) -> None:
    """Raise SummarizeError unless files can be made in `folder`, or in the nearest folder above
    it that exists (the missing ones are made then): found now, not after the model's work."""
    existing = folder
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise SummarizeError(f"{where}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SummarizeError(f"{where}: {existing}: {write_refusal(existing)}")


def write_refusal(folder: Path) -> str:
    """Why nothing can be written in `folder`: its filesystem is mounted read-only, or permission."""
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # AttributeError: no statvfs on this platform
        read_only = False
    return "read-only file system" if read_only else "permission denied"


def _check_diagnostics_file(path: Path, read: _FileSet, written: _FileSet) -> None:
    """--diagnostics-file must be writable and no other file of this run: found out now, not
    after the model has loaded."""
    where = f"--diagnostics-file {path}"
    if path in read:
        raise SummarizeError(f"{where}: is an input of this run; it would be overwritten")
    if path in written:
        raise SummarizeError(f"{where}: is where a summary goes")
    if path.is_dir():
        raise SummarizeError(f"{where}: is a folder")
    folder = path.parent
    if not folder.is_dir():
        raise SummarizeError(f"{where}: no such folder {folder}")
    if not os.access(path if path.exists() else folder, os.W_OK):
        raise SummarizeError(f"{where}: {write_refusal(folder)}")


def _first_time(path: Path, seen: set[Path]) -> bool:
    key = _resolved(path)
    if key in seen:
        return False
    seen.add(key)
    return True


def _scan(folder: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Supported files under `folder`, and the subfolders that could not be read with why, each
    relative to it and sorted; hidden entries and our own outputs are skipped."""
    files: list[Path] = []
    unreadable: list[tuple[Path, str]] = []

    def note_unreadable(exc: OSError) -> None:  # os.walk would drop the folder without a word
        where = os.path.relpath(exc.filename, folder) if exc.filename else "."
        unreadable.append((Path(where), exc.strerror or str(exc)))

    for root, dirs, names in os.walk(folder, onerror=note_unreadable):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            if name.startswith(".") or name.endswith(OUTPUT_SUFFIX):
                continue
            if Path(name).suffix.lower() in SUPPORTED_SUFFIXES:
                files.append(Path(root, name).relative_to(folder))
    return sorted(files), sorted(unreadable)


def _output_paths(rels: list[Path], folder: Path) -> list[Path]:
    """`folder/<rel without suffix>.summary.md`; inputs that would collide (`x.pdf`, `x.txt`)
    keep their suffix (`x.pdf.summary.md`) where that tells them apart."""
    short = [folder / rel.parent / (rel.stem + OUTPUT_SUFFIX) for rel in rels]
    long = [folder / rel.parent / (rel.name + OUTPUT_SUFFIX) for rel in rels]
    short_count, long_count = Counter(short), Counter(long)
    return [
        short_path if short_count[short_path] == 1 or long_count[long_path] > 1 else long_path
        for short_path, long_path in zip(short, long)
    ]

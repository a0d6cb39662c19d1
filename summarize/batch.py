"""Many inputs in one run: find the files, decide where each summary goes (stdout, or files under
`-o`), summarize them in order and keep going past failures. Where summaries land: `output`.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TextIO

from summarize.errors import SummarizeError
from summarize.input_text import SUPPORTED_SUFFIXES, extract_text
from summarize.output import is_up_to_date, print_record, print_summary, write_summary
from summarize.summarizer_factory import make_summarizer
from summarize.types import STDIN, Job, Reporter, Result, Settings, Summarizer, Summary

OUTPUT_SUFFIX = ".summary.md"


@dataclass(frozen=True)
class Plan:
    jobs: list[Job]
    headers: bool  # print `==> path <==` before each summary on stdout


class _Found(NamedTuple):
    input: str  # as the job will name it
    rel: Path  # its path relative to the folder it was found in (its name, for a file argument)
    problem: str  # known now: the job fails with this reason


# --- planning ------------------------------------------------------------------------------


def plan(inputs: Sequence[str], output: str | Path | None = None, *,
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
    several = len(inputs) > 1 or any(i != STDIN and Path(i).is_dir() for i in inputs)
    found = _expand(inputs)
    placed = _place(found, output, several)
    read = _FileSet(Path(f.input) for f in found if f.input != STDIN)
    for job in placed.jobs:
        if job.output is not None and job.output in read:
            raise SummarizeError(
                f"-o {output}: the summary of {job.input} would overwrite the input {job.output}")
    if diagnostics_file is not None:
        written = [job.output for job in placed.jobs if job.output is not None]
        _check_diagnostics_file(Path(diagnostics_file), read, _FileSet(written))
    return placed


def _expand(inputs: Sequence[str]) -> list[_Found]:
    """Every input, folders expanded, in command-line order; a file named twice is read once."""
    found: list[_Found] = []
    seen: set[Path] = set()
    for arg in inputs:
        if arg == STDIN:
            found.append(_Found(STDIN, Path("stdin"), ""))
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
    for f in found:
        if f.problem:
            jobs.append(Job(f.input, problem=f.problem))
            continue
        out = next(outputs)
        if out in owner:
            jobs.append(Job(f.input, problem=f"its output {out} is already written for {owner[out]}"))
        else:
            owner[out] = f.input
            jobs.append(Job(f.input, output=out))
    return Plan(jobs, headers=False)


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
        raise SummarizeError(f"{where}: permission denied")


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


# --- running -------------------------------------------------------------------------------

MODEL_NOT_LOADED = "the model could not be loaded"


class StdoutError(SummarizeError):
    """Standard output is closed or cannot be written (a reader that went away, `| head`, is a
    BrokenPipeError instead: the run then ends quietly)."""


class ModelNotLoaded(SummarizeError):
    """An input fails because the run's model could not be loaded; why is said once, not per input."""

    @classmethod
    def because(cls, exc: Exception) -> ModelNotLoaded:
        return cls(f"{MODEL_NOT_LOADED}: {one_line_reason(exc)}")


def run(
    plan: Plan,
    settings: Settings,
    *,
    ui: Reporter,
    force: bool = False,
    json_lines: bool = False,
    stdout: TextIO | None = None,
) -> list[Result]:
    """Summarize every job in order; a failure is reported and the run goes on.

    Raises StdoutError when a summary or a JSON record cannot be printed.
    """
    printer = StdoutPrinter(stdout or sys.stdout, plan, json_lines=json_lines)
    summarizer: Summarizer | Exception | None = None

    def get_summarizer() -> Summarizer:
        # Made on first need: no model is loaded (and nothing is said) when every output is
        # up to date or every input fails before summarizing. A model that failed to load is
        # said once and not tried again: every later input fails, pointing at that line.
        nonlocal summarizer
        if summarizer is None:
            try:
                summarizer = make_summarizer(settings, ui)
            except Exception as exc:  # noqa: BLE001 - each input fails with it, below
                summarizer = ModelNotLoaded.because(exc)
                ui.error(str(summarizer), exc=exc)
        if isinstance(summarizer, Exception):
            raise summarizer
        return summarizer

    results: dict[int, Result] = {}
    pending: list[tuple[int, Job, str, float]] = []  # read, waiting to be summarized together

    def finish(index: int, job: Job, result: Result) -> None:
        results[index] = result
        printer.print_ready(results)
        ui.file_finished(result)

    def summarize_pending() -> None:
        try:
            summarizer = get_summarizer()
        except Exception as exc:  # the model could not be loaded: each waiting input fails with it
            outcomes: list[Summary | Exception] = [exc] * len(pending)
        else:
            outcomes = _summarize_all(summarizer, [(text, job.label) for _, job, text, _ in pending])
        for (index, job, _, start), outcome in zip(pending, outcomes):
            finish(index, job, written_result(job, outcome, settings, ui=ui, start=start))
        pending.clear()

    try:
        for index, job in enumerate(plan.jobs):
            ui.file_started(job.label, index + 1, len(plan.jobs))
            start = time.perf_counter()
            prepared = _read(job, settings, ui=ui, force=force, start=start)
            if isinstance(prepared, Result):
                finish(index, job, prepared)
                continue
            pending.append((index, job, prepared, start))
            # documents are summarized together when the summarizer can batch them (map-reduce
            # decodes several documents' chunks at once); stdout keeps the inputs' order
            try:
                per_batch = get_summarizer().documents_per_batch
            except Exception:  # reported per input by summarize_pending
                per_batch = 1
            if len(pending) >= per_batch:
                summarize_pending()
        if pending:
            summarize_pending()
    finally:  # the summarizer holds the diagnostics file: flushed and closed however the run ends
        if summarizer is not None and not isinstance(summarizer, Exception):
            summarizer.close()
    return in_plan_order(results, plan, ui=ui)


def in_plan_order(results: dict[int, Result], plan: Plan, *, ui: Reporter) -> list[Result]:
    """Every job's Result in the order of the plan, after the results table when there are several."""
    ordered = [results[i] for i in range(len(plan.jobs))]
    if len(ordered) > 1:
        ui.results_table(ordered)
    return ordered


class StdoutPrinter:
    """Prints results in the inputs' order, though a later input may finish first (it failed to
    read while earlier ones wait to be summarized together): summaries bound for stdout, or with
    --json one record per input, failed and skipped ones too."""

    def __init__(self, out: TextIO | None, plan: Plan, *, json_lines: bool) -> None:
        self.out = out  # None where the process was started with stdout closed
        self.plan = plan
        self.json_lines = json_lines
        self.next = 0  # the index of the next job to print
        self.printed = 0

    def print_ready(self, results: dict[int, Result]) -> None:
        while self.next in results:
            self._print(self.plan.jobs[self.next], results[self.next])
            self.next += 1

    def _print(self, job: Job, result: Result) -> None:
        to_print = self.json_lines or (result.summary is not None and job.output is None)
        if not to_print:
            return
        if self.out is None:
            raise StdoutError("standard output is closed: nowhere to print the summaries (-o writes files)")
        try:
            if self.json_lines:
                print_record(self.out, job, result)
            else:
                print_summary(self.out, job, result, header=self.plan.headers, first=not self.printed)
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as exc:  # ValueError: a closed file object
            raise StdoutError(f"standard output: {getattr(exc, 'strerror', None) or exc}") from exc
        self.printed += 1


def _summarize_all(summarizer: Summarizer, documents: list[tuple[str, str]]) -> list[Summary | Exception]:
    """Each (text, name)'s summary or the exception it raised."""
    if len(documents) > 1:
        try:
            return summarizer.summarize_documents(documents)
        except Exception as exc:  # the batch as a whole failed: every document in it did
            return [exc] * len(documents)
    outcomes: list[Summary | Exception] = []
    for text, name in documents:
        try:
            outcomes.append(summarizer.summarize(text, name=name))
        except Exception as exc:  # one input's failure, whatever it is, must not end the run
            outcomes.append(exc)
    return outcomes


def _read(job: Job, settings: Settings, *, ui: Reporter, force: bool, start: float) -> str | Result:
    """The job's text, or its Result when it ends here (skipped, or failed to read)."""
    try:
        settled = settled_before_reading(job, settings, force=force)
        if settled is not None:
            return settled
        text = extract_text(job.input, password=settings.password, verbose=settings.verbose, notify=ui.note)
        return worth_summarizing(text)
    except Exception as exc:  # one input's failure, whatever it is, must not end the run
        return failed_result(job, exc, ui=ui, start=start)


def settled_before_reading(job: Job, settings: Settings, *, force: bool) -> Result | None:
    """The job's Result when it ends before its input is read: skipped, its output being up to
    date for these settings. Raises SummarizeError for a problem known from planning; None: read it."""
    if job.problem:
        raise SummarizeError(job.problem)
    if job.output is not None and not force and is_up_to_date(job, settings.fingerprint()):
        return Result(job.label, "skipped", "up to date (--force rewrites it)", job.output)
    return None


def worth_summarizing(text: str) -> str:
    """`text`, or SummarizeError when nothing but blanks was extracted."""
    if not text.strip():
        raise SummarizeError("no text to summarize")
    return text


def written_result(job: Job, outcome: Summary | Exception, settings: Settings, *, ui: Reporter, start: float) -> Result:
    """Write a summary to the job's output (if it has one); the job's Result."""
    try:
        if isinstance(outcome, Exception):
            raise outcome
        if job.output is not None:
            write_summary(job.output, outcome, settings)
        return Result(job.label, "ok", "", job.output, outcome, time.perf_counter() - start)
    except Exception as exc:
        return failed_result(job, exc, ui=ui, start=start)


def failed_result(job: Job, exc: Exception, *, ui: Reporter, start: float) -> Result:
    reason = one_line_reason(exc, job)
    if isinstance(exc, ModelNotLoaded):  # the whole reason was said once, before this line
        ui.error(f"{job.label}: {MODEL_NOT_LOADED} (see above)")
    else:
        ui.error(f"{job.label}: {reason}", exc=exc)
    return Result(job.label, "failed", reason, job.output, None, time.perf_counter() - start)


def one_line_reason(exc: Exception, job: Job | None = None) -> str:
    """A one-line reason, without the input's name (the caller prefixes it)."""
    if isinstance(exc, SummarizeError):
        msg = str(exc)
        names = set() if job is None else {job.label, job.input, str(Path(job.input)), Path(job.input).name}
        for name in sorted(names, key=len, reverse=True):
            if msg.startswith(f"{name}: "):
                msg = msg[len(name) + 2 :]
                break
    elif isinstance(exc, OSError) and exc.strerror:
        msg = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    else:
        msg = f"unexpected {type(exc).__name__}: {exc} (--verbose shows details)"
    lines = [line.strip() for line in msg.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__

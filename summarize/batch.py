"""Many inputs in one run: find the files, decide where each summary goes (stdout, or files under
`-o`), summarize them in order and keep going past failures. Where summaries land: `output`.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from summarize.errors import SummarizeError
from summarize.input_text import SUPPORTED_SUFFIXES, extract_text
from summarize.output import is_up_to_date, print_summary, write_summary
from summarize.summarizer_factory import make_summarizer
from summarize.types import STDIN, Job, Reporter, Result, Settings, Summarizer, Summary

OUTPUT_SUFFIX = ".summary.md"


@dataclass(frozen=True)
class Plan:
    jobs: list[Job]
    headers: bool  # print `==> path <==` before each summary on stdout


# --- planning ------------------------------------------------------------------------------


def plan(inputs: Sequence[str], output: str | Path | None = None) -> Plan:
    """Expand folders and map every input to its output.

    `output` is a file for one file input, else a folder (created when missing); a trailing
    slash, or an existing folder, makes it a folder for one input too.

    Raises SummarizeError for a command line that cannot work as a whole (the CLI's usage
    error); a problem with one input (it does not exist, say) fails only that input, later.
    """
    if not inputs:
        raise SummarizeError("no input given")
    if sum(1 for i in inputs if i == STDIN) > 1:
        raise SummarizeError("'-' (stdin) can be read only once")
    has_folder = any(i != STDIN and Path(i).is_dir() for i in inputs)
    several = len(inputs) > 1 or has_folder

    # (job input, its path relative to the folder it was found in, problem), in command-line order
    found: list[tuple[str, Path, str]] = []
    seen: set[Path] = set()
    for arg in inputs:
        if arg == STDIN:
            found.append((STDIN, Path("stdin"), ""))
            continue
        path = Path(arg)
        if not path.is_dir():
            if _first_time(path, seen):
                found.append((str(path), Path(path.name), ""))
            continue
        files = _scan(path)
        if not files:
            suffixes = ", ".join(SUPPORTED_SUFFIXES)
            found.append((str(path), Path(path.name), f"no {suffixes} files in this folder"))
        for rel in files:
            if _first_time(path / rel, seen):
                found.append((str(path / rel), rel, ""))

    if output is None:
        return Plan([Job(i, problem=p) for i, _, p in found], headers=several)
    wants_folder = str(output).endswith(("/", os.sep))
    output = Path(output)
    if not several and not wants_folder and not output.is_dir():
        (i, _, p), = found
        return Plan([Job(i, output=output, problem=p)], headers=False)
    if output.exists() and not output.is_dir():
        raise SummarizeError(f"-o {output}: is a file; several inputs or a folder need a folder")
    outputs = _output_paths([rel for _, rel, _ in found], output)
    jobs: list[Job] = []
    owner: dict[Path, str] = {}
    for (i, _, p), out in zip(found, outputs):
        if p:
            jobs.append(Job(i, problem=p))
        elif out in owner:
            jobs.append(Job(i, problem=f"its output {out} is already written for {owner[out]}"))
        else:
            owner[out] = i
            jobs.append(Job(i, output=out))
    return Plan(jobs, headers=False)


def _first_time(path: Path, seen: set[Path]) -> bool:
    key = path.resolve()
    if key in seen:
        return False
    seen.add(key)
    return True


def _scan(folder: Path) -> list[Path]:
    """Supported files under `folder`, relative to it and sorted; hidden entries and our own
    outputs are skipped."""
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            if name.startswith(".") or name.endswith(OUTPUT_SUFFIX):
                continue
            if Path(name).suffix.lower() in SUPPORTED_SUFFIXES:
                files.append(Path(root, name).relative_to(folder))
    return sorted(files)


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


def run(
    plan: Plan,
    settings: Settings,
    *,
    ui: Reporter,
    force: bool = False,
    json_lines: bool = False,
    stdout: TextIO | None = None,
) -> list[Result]:
    """Summarize every job in order; a failure is reported and the run goes on."""
    stdout = stdout or sys.stdout
    summarizer: Summarizer | Exception | None = None

    def get_summarizer() -> Summarizer:
        # Made on first need: no model is loaded (and nothing is said) when every output is
        # up to date or every input fails before summarizing. A model that failed to load is
        # not tried again: every later input fails with the same error.
        nonlocal summarizer
        if summarizer is None:
            try:
                summarizer = make_summarizer(settings, ui)
            except Exception as exc:  # noqa: BLE001 - raised again, per input, below
                summarizer = exc
        if isinstance(summarizer, Exception):
            raise summarizer
        return summarizer

    results: dict[int, Result] = {}
    pending: list[tuple[int, Job, str, float]] = []  # read, waiting to be summarized together
    printed = 0

    def finish(index: int, job: Job, result: Result) -> None:
        nonlocal printed
        if result.summary is not None and (json_lines or job.output is None):
            print_summary(stdout, job, result, json_lines=json_lines, header=plan.headers, first=not printed)
            printed += 1
        ui.file_finished(result)
        results[index] = result

    def summarize_pending() -> None:
        try:
            summarizer = get_summarizer()
        except Exception as exc:  # the model could not be loaded: each waiting input fails with it
            outcomes: list[Summary | Exception] = [exc] * len(pending)
        else:
            outcomes = _summarize_all(summarizer, [(text, job.label) for _, job, text, _ in pending])
        for (index, job, _, start), outcome in zip(pending, outcomes):
            finish(index, job, _written(job, outcome, settings, ui=ui, start=start))
        pending.clear()

    try:
        for index, job in enumerate(plan.jobs):
            ui.file_started(job.label, index + 1, len(plan.jobs))
            start = time.perf_counter()
            prepared = _read(job, settings, ui=ui, force=force, start=start)
            if isinstance(prepared, Result):  # prints nothing on stdout: the order there is kept
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
    ordered = [results[i] for i in range(len(plan.jobs))]
    if len(ordered) > 1:
        ui.results_table(ordered)
    return ordered


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
        if job.problem:
            raise SummarizeError(job.problem)
        if job.output is not None and not force and is_up_to_date(job, settings.fingerprint()):
            return Result(job.label, "skipped", "up to date (--force rewrites it)", job.output)
        text = extract_text(job.input, password=settings.password, verbose=settings.verbose)
        if not text.strip():
            raise SummarizeError("no text to summarize")
        return text
    except Exception as exc:  # one input's failure, whatever it is, must not end the run
        return _failed(job, exc, ui=ui, start=start)


def _written(job: Job, outcome: Summary | Exception, settings: Settings, *, ui: Reporter, start: float) -> Result:
    """Write a summary to the job's output (if it has one); the job's Result."""
    try:
        if isinstance(outcome, Exception):
            raise outcome
        if job.output is not None:
            write_summary(job.output, outcome, settings)
        return Result(job.label, "ok", "", job.output, outcome, time.perf_counter() - start)
    except Exception as exc:
        return _failed(job, exc, ui=ui, start=start)


def _failed(job: Job, exc: Exception, *, ui: Reporter, start: float) -> Result:
    reason = _reason(exc, job)
    ui.error(f"{job.label}: {reason}", exc=exc)
    return Result(job.label, "failed", reason, job.output, None, time.perf_counter() - start)


def _reason(exc: Exception, job: Job) -> str:
    """A one-line reason, without the input's name (the caller prefixes it)."""
    if isinstance(exc, SummarizeError):
        msg = str(exc)
        names = {job.label, job.input, str(Path(job.input)), Path(job.input).name}
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

"""Many inputs in one run: find the files, decide where each summary goes (stdout, or files under
`-o`), summarize them in order and keep going past failures. Where summaries land: `output`.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from summarize.errors import ModelNotAvailable, SummarizeError
from summarize.inputs.extract import extract_document
from summarize.inputs.places import Document
from summarize.records import Job, Result, Summary
from summarize.run.outcomes import ModelNotLoaded, failed_result, in_plan_order, settled_before_reading, worth_summarizing, written_result
from summarize.run.output import print_record, print_summary
from summarize.run.plan import Plan
from summarize.settings import Settings
from summarize.summarizers.base import DocumentSummarizer
from summarize.summarizers.factory import make_summarizer
from summarize.ui.reporter import Reporter

# --- planning ------------------------------------------------------------------------------


# --- running -------------------------------------------------------------------------------


class NamedModelMissing(SummarizeError):
    """The model the user named (-m) cannot be had: the run stops (a usage error), as only the
    default model may fall back to an extractive summary."""


class StdoutError(SummarizeError):
    """Standard output is closed or cannot be written (a reader that went away, `| head`, is a
    BrokenPipeError instead: the run then ends quietly)."""


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
    summarizer: DocumentSummarizer | Exception | None = None

    def get_summarizer() -> DocumentSummarizer:
        # Made on first need: no model is loaded (and nothing is said) when every output is
        # up to date or every input fails before summarizing. A model that failed to load is
        # said once and not tried again: every later input fails, pointing at that line.
        nonlocal summarizer
        if summarizer is None:
            try:
                summarizer = make_summarizer(settings, ui)
            except ModelNotAvailable as exc:
                if not settings.model_fallback:
                    raise NamedModelMissing(str(exc)) from exc
                summarizer = ModelNotLoaded.because(exc)
                ui.error(str(summarizer), exc=exc)
            except Exception as exc:  # noqa: BLE001 - each input fails with it, below
                summarizer = ModelNotLoaded.because(exc)
                ui.error(str(summarizer), exc=exc)
        if isinstance(summarizer, Exception):
            raise summarizer
        return summarizer

    results: dict[int, Result] = {}
    pending: list[tuple[int, Job, Document, float]] = []  # read, waiting to be summarized together

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
            outcomes = _summarize_all(summarizer, [(document, job.label) for _, job, document, _ in pending])
        for (index, job, _, start), outcome in zip(pending, outcomes):
            finish(index, job, written_result(job, outcome, settings, ui=ui, start=start, force=force))
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
            except NamedModelMissing:
                raise
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


def _summarize_all(summarizer: DocumentSummarizer, documents: list[tuple[Document, str]]) -> list[Summary | Exception]:
    """Each (document, name)'s summary or the exception it raised."""
    if len(documents) > 1:
        try:
            return summarizer.summarize_documents([(document.text, name) for document, name in documents],
                                                  [document.places for document, _ in documents])
        except Exception as exc:  # the batch as a whole failed: every document in it did
            return [exc] * len(documents)
    outcomes: list[Summary | Exception] = []
    for document, name in documents:
        try:
            outcomes.append(summarizer.summarize(document.text, name=name, places=document.places))
        except Exception as exc:  # one input's failure, whatever it is, must not end the run
            outcomes.append(exc)
    return outcomes


def _read(job: Job, settings: Settings, *, ui: Reporter, force: bool, start: float) -> Document | Result:
    """The job's document, or its Result when it ends here (skipped, or failed to read)."""
    try:
        settled = settled_before_reading(job, settings, force=force)
        if settled is not None:
            return settled
        document = extract_document(job.input, password=settings.password, verbose=settings.verbose, notify=ui.note,
                                    max_bytes=settings.max_input_size)
        worth_summarizing(document.text)
        return document
    except Exception as exc:  # one input's failure, whatever it is, must not end the run
        return failed_result(job, exc, ui=ui, start=start)











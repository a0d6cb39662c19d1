"""What became of one input, the same in a local run and on a cluster: skipped before reading, failed
(with a one-line reason), or summarized and written.
"""

from __future__ import annotations

import time
from pathlib import Path

from summarize.errors import SummarizeError
from summarize.records import Job, Result, Summary
from summarize.run.output import check_replaceable, is_up_to_date, write_summary
from summarize.run.plan import Plan
from summarize.settings import Settings
from summarize.ui.reporter import Reporter

MODEL_NOT_LOADED = "the model could not be loaded"


class ModelNotLoaded(SummarizeError):
    """An input fails because the run's model could not be loaded; why is said once, not per input."""

    @classmethod
    def because(cls, exc: Exception) -> ModelNotLoaded:
        return cls(f"{MODEL_NOT_LOADED}: {one_line_reason(exc)}")


def in_plan_order(results: dict[int, Result], plan: Plan, *, ui: Reporter) -> list[Result]:
    """Every job's Result in the order of the plan, after the results table when there are several."""
    ordered = [results[i] for i in range(len(plan.jobs))]
    if len(ordered) > 1:
        ui.results_table(ordered)
    return ordered


def settled_before_reading(job: Job, settings: Settings, *, force: bool) -> Result | None:
    """The job's Result when it ends before its input is read: skipped, its output being up to
    date for these settings. Raises SummarizeError for a problem known from planning; None: read it."""
    if job.problem:
        raise SummarizeError(job.problem)
    if job.output is not None and not force and is_up_to_date(job, settings.fingerprint()):
        return Result(job.label, "skipped", "up to date (--force rewrites it)", job.output)
    if job.output is not None:  # found now, before the input is read and summarized
        check_replaceable(job.output, force=force)
    return None


def worth_summarizing(text: str) -> str:
    """`text`, or SummarizeError when nothing but blanks was extracted."""
    if not text.strip():
        raise SummarizeError("no text to summarize")
    return text


def written_result(job: Job, outcome: Summary | Exception, settings: Settings, *, ui: Reporter, start: float,
                   force: bool | None = None) -> Result:
    """Write a summary to the job's output (if it has one); the job's Result. With `force` given,
    the output is checked again just before it is replaced (it may have appeared meanwhile);
    None leaves it to the check made before reading."""
    try:
        if isinstance(outcome, Exception):
            raise outcome
        if job.output is not None:
            write_summary(job.output, outcome, settings, force=True if force is None else force)
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

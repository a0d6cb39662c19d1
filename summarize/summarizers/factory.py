"""Pick the summarizer for a run's settings: the model's, or the extractive one when no model is
asked for or none can be had.
"""

from __future__ import annotations

from contextlib import ExitStack

from summarize.diagnostics.log import DiagnosticsLog
from summarize.settings import Settings
from summarize.summarizers.base import DocumentSummarizer
from summarize.summarizers.extractive import ExtractiveSummarizer
from summarize.ui.reporter import Reporter


def make_summarizer(settings: Settings, ui: Reporter) -> DocumentSummarizer:
    """The summarizer for these settings. Call it once per run: it may load a model.

    A model that cannot be had (offline and not cached, no such folder) is not an error: the user
    is told in one line and gets the extractive summary. The caller closes what it returns.
    """
    extractive = ExtractiveSummarizer(settings)
    if settings.extractive:
        return extractive
    # Imported on first need: the engine takes seconds to import (torch with it), and --help or
    # an extractive run never needs it.
    from summarize.engine import ModelNotAvailable
    from summarize.summarizers.model import ModelSummarizer
    from summarize.summarizers.read_cache import read_cache_for
    from summarize.summarizers.session import load_session

    try:
        session = load_session(settings, ui.note, ui.waiting)
    except ModelNotAvailable as exc:
        ui.note(f"{exc}; writing an extractive summary instead")
        return extractive
    with ExitStack() as on_failure:
        diagnostics = None
        if settings.diagnostics_file:
            # a file that cannot be written is said once and dropped: it never costs a summary
            diagnostics = on_failure.enter_context(DiagnosticsLog(settings.diagnostics_file, on_error=ui.error))
        summarizer = ModelSummarizer(
            session,
            words=settings.words,
            focus=settings.focus,
            strategy=settings.strategy,
            chunk_tokens=settings.chunk_tokens,
            overlap=settings.overlap,
            batch_memory=settings.batch_memory,
            cache=read_cache_for(settings, session.model, ui.note),
            fallback=extractive,
            notify=ui.note,
            on_span=ui.span if ui.shows_live_state else None,
            on_phase=ui.phase,
            diagnostics=diagnostics,
        )
        on_failure.pop_all()  # made: the summarizer owns the log now, and closes it
    return summarizer

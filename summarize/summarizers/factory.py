"""Pick the summarizer for a run's settings: the model's, or the extractive one when no model is
asked for or none can be had.
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from pathlib import Path

from summarize.diagnostics.log import DiagnosticsLog
from summarize.settings import Settings
from summarize.summarizers.base import DocumentSummarizer
from summarize.summarizers.extractive import ExtractiveSummarizer
from summarize.summarizers.prompts import language_sentence
from summarize.ui.reporter import Reporter

# owner/name, or owner/name:QUANT for a GGUF file on the hub: found (or not) only by asking the hub
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+(:[\w.-]+)?")
_MODEL_FILE_SUFFIXES = (".gguf", ".pth", ".safetensors")


def missing_model_path(source: str) -> str | None:
    """Why `source` names no model, when that is plain without loading anything (a path that does
    not exist and cannot be a hub id); None where only loading can tell."""
    path = Path(source).expanduser()
    if path.exists():
        return None
    looks_like_path = source.startswith((".", "/", "~")) or path.suffix.lower() in _MODEL_FILE_SUFFIXES
    if _HUB_ID.fullmatch(source) and not looks_like_path:
        return None
    return f"-m {source}: no such model file or folder"


def make_summarizer(settings: Settings, ui: Reporter) -> DocumentSummarizer:
    """The summarizer for these settings. Call it once per run: it may load a model.

    A model that cannot be had (offline and not cached, no such folder) is not an error where
    `settings.model_fallback` allows it: the user is told in one line and gets the extractive
    summary; else ModelNotAvailable is raised. The caller closes what it returns.
    """
    language_sentence(settings.language)  # a language that is no name fails before anything loads
    extractive = ExtractiveSummarizer(settings)
    if settings.extractive:
        _say_it_cannot_translate(settings, ui)
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
        if not settings.model_fallback:
            raise
        ui.note(f"{exc}; writing an extractive summary instead")
        _say_it_cannot_translate(settings, ui)
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
            language=settings.language,
            form=settings.format,
            cite=settings.cite,
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


def _say_it_cannot_translate(settings: Settings, ui: Reporter) -> None:
    """--language with the extractive summary: said once, and the run goes on in the document's language."""
    if settings.language:
        ui.note(f"--language {' '.join(settings.language.split())}: the extractive summary quotes the document "
                "and cannot translate it; it stays in the document's language")

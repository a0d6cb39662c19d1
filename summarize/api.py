"""Summaries from Python: the CLI's settings as keyword arguments, with the same defaults.

    from summarize import Summarizer, summarize_file, summarize_text
    summary = summarize_file("report.pdf", words=300)       # loads the model, summarizes, closes
    with Summarizer(words=100) as s:                         # the model loaded once for many calls
        summaries = [s.summarize_file(path) for path in paths]
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from summarize.errors import SummarizeError
from summarize.inputs.extract import extract_document
from summarize.inputs.places import Places
from summarize.records import Summary
from summarize.settings import Settings
from summarize.summarizers.factory import make_summarizer
from summarize.ui.notes import NotesReporter


class Summarizer:
    """Loads the model once (on first use) and summarizes any number of texts and files.

    Keyword arguments are `Settings`' fields, the CLI's options by their long names (`words`,
    `model`, `device`, `dtype`, `quantize`, `chunk_tokens`, `overlap`, `strategy`, `extractive`,
    `focus`, `language`, `format`, `cite`, `temperature`, `top_k`, `top_p`, `seed`,
    `diagnostics_file`, `password`). `notify` receives
    the notes the CLI prints on stderr (a model that cannot be had, say). Failures raise
    `SummarizeError` with the CLI's one-line message.
    """

    def __init__(self, *, notify: Callable[[str], None] | None = None, **settings: Any) -> None:
        try:
            self.settings = Settings(**settings)
        except TypeError as exc:  # an unknown keyword: say which, as the CLI would for an option
            raise SummarizeError(f"unknown setting: {exc}") from None
        self._reporter = NotesReporter(notify)
        self._summarizer = None

    def summarize_text(self, text: str, *, name: str = "<text>", places: Places | None = None) -> Summary:
        """`text`'s summary; its citations name the text's sections where it has Markdown
        headings, else its lines (`places` says otherwise)."""
        if not text.strip():
            raise SummarizeError(f"{name}: no text to summarize")
        if self._summarizer is None:
            self._summarizer = make_summarizer(self.settings, self._reporter)
        return self._summarizer.summarize(text, name=name, places=places)

    def summarize_file(self, path: str | Path) -> Summary:
        """A document the CLI reads (PDF, text, Markdown, EPUB, Word, HTML, an http(s) URL, or "-" for stdin), read as it reads it."""
        document = extract_document(path, password=self.settings.password, notify=self._reporter.note)
        return self.summarize_text(document.text, name=str(path), places=document.places)

    def close(self) -> None:
        """Release the diagnostics file (the model goes with the object)."""
        if self._summarizer is not None:
            self._summarizer.close()

    def __enter__(self) -> Summarizer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def summarize_text(text: str, *, name: str = "<text>", notify: Callable[[str], None] | None = None,
                   **settings: Any) -> Summary:
    """One text's summary (see `Summarizer` for the settings)."""
    with Summarizer(notify=notify, **settings) as summarizer:
        return summarizer.summarize_text(text, name=name)


def summarize_file(path: str | Path, *, notify: Callable[[str], None] | None = None, **settings: Any) -> Summary:
    """One file's summary (see `Summarizer` for the settings)."""
    with Summarizer(notify=notify, **settings) as summarizer:
        return summarizer.summarize_file(path)

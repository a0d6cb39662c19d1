"""One worker of a cluster run: it makes its summarizer once (the model loaded on the first
document), reads each document from the bytes the driver sent, and sends back the summary or the
document's own failure. Nothing here writes a file or needs Ray: `ray_pool` runs it as an actor.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
from dataclasses import dataclass, field

from summarize.errors import SummarizeError
from summarize.inputs.extract import document_from_bytes
from summarize.records import Summary
from summarize.run.outcomes import ModelNotLoaded, one_line_reason, worth_summarizing
from summarize.settings import Settings
from summarize.summarizers.base import DocumentSummarizer
from summarize.summarizers.factory import make_summarizer
from summarize.ui.notes import NotesReporter


@dataclass
class Outcome:
    """What became of one document on a worker: `summary`, or the `error` it failed with."""

    summary: Summary | None
    error: Exception | None
    worker: str  # the worker's host and process id
    seconds: float  # reading and summarizing, on the worker
    notes: list[str] = field(default_factory=list)  # said meanwhile: loading the model, reading the text


class DocumentWorker:
    """Summarizes documents one at a time with one summarizer, made on the first document."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.name = f"{socket.gethostname()} pid {os.getpid()}"
        self._notes: list[str] = []
        self._reporter = NotesReporter(self._notes.append)
        self._summarizer: DocumentSummarizer | ModelNotLoaded | None = None

    def summarize(self, data: bytes, source: str, label: str) -> Outcome:
        """The summary of `data`, the bytes of input `source` (named `label` in messages)."""
        start = time.perf_counter()
        summary, error = None, None
        try:
            document = document_from_bytes(data, source, password=self.settings.password, verbose=self.settings.verbose,
                                           notify=self._reporter.note)
            summary = self._get_summarizer().summarize(worth_summarizing(document.text), name=label, places=document.places)
        except Exception as exc:  # the document's own failure: sent back, never a dead worker
            error = _portable(exc)
        notes, self._notes[:] = self._notes[:], []
        return Outcome(summary, error, self.name, time.perf_counter() - start, notes)

    def _get_summarizer(self) -> DocumentSummarizer:
        # A model that failed to load is not tried again: every later document fails with it.
        if self._summarizer is None:
            try:
                self._summarizer = make_summarizer(self.settings, self._reporter)
            except Exception as exc:  # noqa: BLE001 - each document fails with it
                self._summarizer = ModelNotLoaded.because(exc)
        if isinstance(self._summarizer, ModelNotLoaded):
            raise self._summarizer
        return self._summarizer


def _portable(exc: Exception) -> Exception:
    """`exc` if it survives the trip to the driver, else its one-line reason as a SummarizeError."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - an exception holding a lock, a file, a generator ...
        return SummarizeError(one_line_reason(exc))
    return exc

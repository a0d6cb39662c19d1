"""The UI of a library call: notes go to a callback (or nowhere); nothing is drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from summarize.records import ModelProgress, Result


class NotesReporter:
    """The `Reporter` of a library call: notes go to `notify` (or nowhere); nothing is drawn."""

    shows_live_state = False

    def __init__(self, notify: Callable[[str], None] | None) -> None:
        self.notify = notify

    def note(self, msg: str) -> None:
        if self.notify is not None:
            self.notify(msg)

    def error(self, msg: str, *, exc: BaseException | None = None) -> None:
        self.note(msg)

    def file_started(self, name: str, i: int, n: int) -> None: ...

    def file_finished(self, result: Result) -> None: ...

    def results_table(self, results: Sequence[Result]) -> None: ...

    def phase(self, progress: ModelProgress) -> None: ...

    def span(self, progress: ModelProgress, report: Any) -> None: ...

    def waiting(self, what: str | None) -> None: ...

    def close(self) -> None: ...

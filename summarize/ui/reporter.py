"""What the library tells the user about (stderr only, never stdout): the contract every UI keeps,
the terminal's, the quiet one and a library call's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from summarize.records import ModelProgress, Result


class Reporter(Protocol):
    """What the library tells the user about, through the UI (stderr only, never stdout).

    `report` in `span` is the engine's SpanReport; it is not named here, so that this module
    stays below the engine.
    """

    def note(self, msg: str) -> None: ...

    def error(self, msg: str, *, exc: BaseException | None = None) -> None: ...

    def file_started(self, name: str, i: int, n: int) -> None: ...

    def file_finished(self, result: Result) -> None: ...

    def results_table(self, results: Sequence[Result]) -> None: ...

    @property
    def shows_live_state(self) -> bool:
        """Whether `span` is worth calling: per-token reports cost a share of each decode step."""
        ...

    def phase(self, progress: ModelProgress) -> None: ...

    def span(self, progress: ModelProgress, report: Any) -> None: ...

    def waiting(self, what: str | None) -> None:
        """What the user waits for now (loading the model, compiling a step), or None: over."""
        ...

    def close(self) -> None: ...

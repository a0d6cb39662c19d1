"""Everything meant for humans, on stderr. The library reports events; these classes render them.

stdout is never touched here: it carries only summaries (or JSON lines). Messages arrive raw and
are made printable here (`printable`: a file name may hold escape sequences), always as rich
`Text`, never markup, so that `[red]` in a file name stays those characters.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from summarize.records import ModelProgress, Result
from summarize.ui.escape import printable

# Off a terminal rich assumes 80 columns; logs read better with the table on unwrapped lines.
PLAIN_TABLE_WIDTH = 240
STATUS_STYLE = {"ok": "green", "skipped": "dim", "failed": "bold red"}


class RichUI:
    """Notes and errors as single lines, a progress bar over files on a terminal, a results table:
    the `Reporter` the library talks to.

    rich honours NO_COLOR and drops colours and live displays when stderr is not a terminal.
    """

    def __init__(self, *, verbose: bool = False, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.verbose = verbose
        self._progress: ModelProgress | None = None
        self._task = None
        self._total = 0
        self._live = None
        self._view = None
        self._waiting: Waiting | None = None

    def _line(self, text: str, style: str | None = None) -> None:
        # A styled Text, not print(style=...): that style would also paint a live progress bar.
        # soft_wrap: a long message stays one line instead of being folded at the console width.
        self.console.print(Text(printable(text), style=style or ""), soft_wrap=True)

    def note(self, msg: str) -> None:
        self._line(f"note: {msg}", style="dim")

    def error(self, msg: str, *, exc: BaseException | None = None) -> None:
        """One line; with --verbose the traceback of `exc` follows it."""
        self._line(f"error: {msg}", style="bold red")
        if self.verbose and exc is not None:
            for line in "".join(traceback.format_exception(exc)).rstrip().splitlines():
                self._line(line)

    def file_started(self, name: str, i: int, n: int) -> None:
        """Input `i` of `n` (1-based) begins."""
        self._total = n
        if not self.console.is_terminal:
            return
        if self._progress is None:
            self._progress = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._task = self._progress.add_task(printable(name), total=n)
            self._start_live()
        self._progress.update(self._task, description=printable(name))  # finished files advance the bar

    def _start_live(self) -> None:
        """One live display for everything (rich allows one at a time): files bar, state view."""
        if self._live is None:
            from rich.live import Live

            self._live = Live(self, console=self.console, refresh_per_second=8, transient=True)
            self._live.start()

    def __rich__(self):
        from rich.console import Group

        return Group(*(part for part in (self._progress, self._view, self._waiting) if part is not None))

    def file_finished(self, result: Result) -> None:
        if self._progress is not None:
            self._progress.advance(self._task)
        if result.status == "skipped" and self._total == 1:
            self.note(f"{result.input}: {result.reason}")

    def results_table(self, results: Sequence[Result]) -> None:
        self.close()
        table = Table(box=box.SIMPLE_HEAD, show_edge=False)
        table.add_column("input", overflow="fold")
        table.add_column("status")
        table.add_column("words", justify="right")
        table.add_column("seconds", justify="right")
        table.add_column("reason", overflow="fold")
        for r in results:
            table.add_row(
                Text(printable(r.input)),
                Text(r.status, style=STATUS_STYLE[r.status]),
                "" if r.words is None else str(r.words),
                "" if r.seconds is None else f"{r.seconds:.2f}",
                Text(printable(r.reason)),
            )
        if not self.console.is_terminal:
            self.console.width = max(self.console.width, PLAIN_TABLE_WIDTH)
        self.console.print(table)

    # -- the model's state, live (only on a terminal) -----------------------------------------

    @property
    def shows_live_state(self) -> bool:
        return self.console.is_terminal

    def phase(self, progress: ModelProgress) -> None:
        """The summarizer moved to another chunk or phase."""
        if not self.console.is_terminal:
            return
        if self._view is None:
            from summarize.ui.live_view import StateView

            self._view = StateView()
            self._start_live()
        self._view.set_phase(progress)

    def span(self, progress: ModelProgress, report: Any) -> None:
        """The engine finished a span (a prefill or a decode step); keep its numbers for the view."""
        if self._view is not None:
            self._view.update(report)

    def waiting(self, what: str | None) -> None:
        """What the user waits for (loading, compiling), shown with its seconds until None comes."""
        if not self.console.is_terminal:
            return
        self._waiting = None if what is None else Waiting(what)
        if what is not None:
            self._start_live()

    def close(self) -> None:
        """Stop the live displays (also on errors and interrupts, so the cursor comes back)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
        self._progress = self._view = self._waiting = None


class Waiting:
    """A line of the live display: what is going on, and for how many seconds so far."""

    def __init__(self, what: str) -> None:
        self.what, self.started = printable(what), time.perf_counter()

    def __rich__(self) -> Text:
        return Text(f"{self.what}…  {time.perf_counter() - self.started:,.0f} s", style="dim")


class QuietUI(RichUI):
    """--quiet: errors only, still one line each."""

    def note(self, msg: str) -> None:
        pass

    def file_started(self, name: str, i: int, n: int) -> None:
        pass

    def file_finished(self, result: Result) -> None:
        pass

    def results_table(self, results: Sequence[Result]) -> None:
        pass

    shows_live_state = False

    def phase(self, progress: ModelProgress) -> None:
        pass

    def span(self, progress: ModelProgress, report: Any) -> None:
        pass

    def waiting(self, what: str | None) -> None:
        pass
